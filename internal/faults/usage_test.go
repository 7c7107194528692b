package faults_test

import (
	"context"
	"database/sql"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// usageLoad makes n echo calls for tenant over 4 workers and returns the
// slowest; every call must be admitted.
func usageLoad(t *testing.T, e *env, tenant string, n int) time.Duration {
	t.Helper()
	tok := token(t, tenant, "agent")
	var mu sync.Mutex
	var slowest time.Duration
	testenv.Run(4, n, func(i int) {
		r := e.call(i, tok, "echo", map[string]any{"text": "x"}, 10*time.Second)
		if !r.ok() {
			t.Errorf("call %d for %s: %s %v %s", i, tenant, kind(r), r.Err, r.Body)
		}
		mu.Lock()
		slowest = max(slowest, r.Elapsed)
		mu.Unlock()
	})
	return slowest
}

// sqliteUsage opens a usage store in a new SQLite file, at path; it is
// closed when the test ends.
func sqliteUsage(t *testing.T) (st *sqlite.Store, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "usage.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st, path
}

// meteredEnv starts a redis-server and instances gateways (0 means 1)
// metering into a new SQLite usage file (flushed every 100ms), then makes 20
// calls of acme and waits for their flush: the start of the tests of a
// usage file that fails. period is the usage period of those calls.
func meteredEnv(t *testing.T, instances int) (e *env, st *sqlite.Store, path, period string) {
	t.Helper()
	st, path = sqliteUsage(t)
	redis := testenv.StartRedis(t, nil)
	e = newEnv(t, opts{Usage: st, Instances: instances, Config: `
store: {redis: "redis://` + redis.Addr + `", timeout: 2s}
usage: {flush_interval: 100ms}
`})
	period = usage.Period(time.Now())
	usageLoad(t, e, "acme", 20)
	eventually(t, 10*time.Second, "the first flush", func() bool {
		return durable(t, st, "acme", period) == limit.Usage{Charged: 20, Calls: 20}
	})
	return e, st, path, period
}

// The SQLite usage file is locked by another process's write transaction
// (BEGIN EXCLUSIVE from a second database/sql handle, held longer than the
// store's busy timeout of 5s) while two gateways sharing Redis take calls:
// no call waits for it, flushes fail and are counted
// (mcpgate_usage_flush_failures_total), and once the lock is released the
// durable totals are exactly the admitted calls. (A store that is closed or
// gone, and dynalite killed or partitioned, are gateway/usage_test.go's
// TestUsageStoreDownThenBack.)
func TestUsageSQLiteLocked(t *testing.T) {
	leakCheck(t)
	e, st, path, period := meteredEnv(t, 2)

	// The locker waits for the lock (a flush may be writing as it asks:
	// with no wait, BEGIN EXCLUSIVE failed with SQLITE_BUSY in a CI run);
	// the gateways then wait for it, up to their own busy timeout.
	locker, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close() })
	ctx := context.Background()
	conn, err := locker.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	locked := time.Now()
	before := e.metric(0, "mcpgate_usage_flush_failures_total") + e.metric(1, "mcpgate_usage_flush_failures_total")
	var slowest time.Duration
	for time.Since(locked) < 6500*time.Millisecond { // past the 5s busy timeout
		slowest = max(slowest, usageLoad(t, e, "acme", 20), usageLoad(t, e, "initech", 4))
		time.Sleep(200 * time.Millisecond)
	}
	failures := e.metric(0, "mcpgate_usage_flush_failures_total") + e.metric(1, "mcpgate_usage_flush_failures_total") - before
	st0, ready := e.get(0, "/readyz")
	t.Logf("locked %v: slowest call %v, flush failures %v, /readyz %d %q", time.Since(locked).Round(time.Millisecond), slowest, failures, st0, ready)
	if slowest > 2*time.Second {
		t.Errorf("a call took %v while the usage file was locked: calls must not wait for it", slowest)
	}
	if failures == 0 {
		t.Error("no flush failure counted while the usage file was locked past the busy timeout")
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	served := e.up.Calls("echo")
	e.stop(0)
	e.stop(1)
	var total limit.Usage
	for _, tenant := range []string{"acme", "initech"} {
		u := durable(t, st, tenant, period)
		total.Charged += u.Charged
		total.Calls += u.Calls
	}
	if total.Calls != served || total.Charged != served {
		t.Fatalf("durable usage %+v after the lock was released and the final flush; the upstream served %d calls", total, served)
	}
	t.Logf("durable usage %+v == %d admitted calls", total, served)
	if st0 != http.StatusOK {
		t.Logf("/readyz said %d while the usage store was locked", st0)
	}
}
