package redisstore

import (
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// On one redis-server, layered calls (one script call each) stay exact
// while the server drops its functions or scripts under load, and the
// fallback did run: after FUNCTION FLUSH the library is loaded again
// (FUNCTION LOAD), after SCRIPT FLUSH the script goes out with EVAL. The
// Cluster's counterpart is TestClusterLayeredFlushAndFailover.
func TestLayeredFlushUnderLoad(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		functions bool
		flush     func(c rueidis.Client) rueidis.Completed
		resent    string // the command the fallback sends
	}{
		{"functions", true, func(c rueidis.Client) rueidis.Completed { return c.B().FunctionFlush().Build() }, "function|load"},
		{"scripts", false, func(c rueidis.Client) rueidis.Completed { return c.B().ScriptFlush().Build() }, "eval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := testenv.StartRedis(t, nil)
			s, err := New(r.Client(t), &Options{Timeout: testTimeout, NoFunctions: !tc.functions})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			admin := r.Client(t) // flushes and reads the stats beside the store's client
			ctx := ctxT(t)

			const L = 150
			gr := rule("global-flush", limit.FixedWindow, L, time.Hour)
			gc := limit.Check{Rule: gr, Key: keyspace.RateLimit(keyspace.PerGlobal, gr.Name, keyspace.Owner{})}
			meter := func(tenant string) *limit.Meter { m := testMeter(tenant, 0); return &m }
			before, _ := commandCalls(t, admin, tc.resent)
			var admitted, failed int64
			n := flushedDuring(5*time.Millisecond, func() bool { return admin.Do(ctx, tc.flush(admin)).Error() == nil },
				func() { admitted, failed = layeredLoad(t, s, 8, 40, time.Millisecond, gc, "flush-"+tc.name+"-", meter) })
			after, _ := commandCalls(t, admin, tc.resent)
			t.Logf("%d flushes during the load; the fallback sent %s %d times", n, tc.resent, after-before)
			if failed != 0 || admitted != L {
				t.Errorf("8 callers x 40 layered calls under a global limit of %d, flushed meanwhile: %d admitted, %d errors; want %d and 0", L, admitted, failed, L)
			}
			if n == 0 || after-before < 1 {
				t.Errorf("%d flushes, %d %s: the fallback path was not exercised", n, after-before, tc.resent)
			}
			if used := netCalls(ctx, s, "flush-"+tc.name+"-", 8); used != L {
				t.Errorf("meters hold %d net calls, want %d (denied calls charge no meter)", used, L)
			}
		})
	}
}
