package redisstore

import (
	"strconv"
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
			stop, flushed := make(chan struct{}), make(chan int)
			go func() {
				n := 0
				defer func() { flushed <- n }()
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					if admin.Do(ctx, tc.flush(admin)).Error() == nil {
						n++
					}
				}
			}()
			admitted, failed := layeredLoad(t, s, 8, 40, time.Millisecond, gc, "flush-"+tc.name+"-", meter)
			close(stop)
			n := <-flushed
			after, _ := commandCalls(t, admin, tc.resent)
			t.Logf("%d flushes during the load; the fallback sent %s %d times", n, tc.resent, after-before)
			if failed != 0 || admitted != L {
				t.Errorf("8 callers x 40 layered calls under a global limit of %d, flushed meanwhile: %d admitted, %d errors; want %d and 0", L, admitted, failed, L)
			}
			if n == 0 || after-before < 1 {
				t.Errorf("%d flushes, %d %s: the fallback path was not exercised", n, after-before, tc.resent)
			}
			var used int64
			for i := range 8 {
				if ms, ok, err := s.ReadMeter(ctx, testMeter("flush-"+tc.name+"-"+strconv.Itoa(i), 0).Key); err == nil && ok {
					used += ms.Live.NetCalls()
				}
			}
			if used != L {
				t.Errorf("meters hold %d net calls, want %d (denied calls charge no meter)", used, L)
			}
		})
	}
}
