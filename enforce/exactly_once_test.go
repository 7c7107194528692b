//go:build unix

package enforce_test

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// Exactly once under faults: two engines on one real redis-server meter
// into one SQLite file while the test breaks Redis in the middle of the
// traffic. Every call the engines admit reaches the "upstream" (counted
// here); after Close (the final flush) the durable usage equals that count,
// whatever the fault did to the writes in flight: none lost, none doubled,
// and nothing counted as unmetered.
func TestExactlyOnceUnderFaults(t *testing.T) {
	t.Parallel()
	faults := []struct {
		name  string
		fault func(t *testing.T, r *testenv.Redis, admin rueidis.Client)
	}{
		// SIGSTOP for many store timeouts: writes in flight time out (then
		// run on SIGCONT), the store breaker opens, calls are admitted
		// open; their charges are placed again with their ops.
		{"sigstop", func(t *testing.T, r *testenv.Redis, admin rueidis.Client) {
			thaw := r.Freeze(t)
			time.Sleep(600 * time.Millisecond)
			thaw()
		}},
		// SIGKILL and a restart with an empty data set: the meter and the
		// ops' markers are gone; what the durable store does not hold is
		// placed again from the engines' journals.
		{"kill_restart", func(t *testing.T, r *testenv.Redis, admin rueidis.Client) {
			r.Kill()
			time.Sleep(300 * time.Millisecond)
			r.Restart(t)
		}},
		// The engines' connections cut (CLIENT KILL from another client)
		// again and again while scripts are in flight: replies are lost
		// after the script ran, or before it was read.
		{"client_kill", func(t *testing.T, r *testenv.Redis, admin rueidis.Client) {
			for range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				err := admin.Do(ctx, admin.B().Arbitrary("CLIENT", "KILL").Args("TYPE", "normal", "SKIPME", "yes").Build()).Error()
				cancel()
				if err != nil {
					t.Logf("CLIENT KILL: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			exactlyOnce(t, f.fault)
		})
	}
}

func exactlyOnce(t *testing.T, fault func(t *testing.T, r *testenv.Redis, admin rueidis.Client)) {
	cfg, err := policy.Parse("exactly_once.yaml", []byte(`upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {timeout: 100ms, on_error: open}
usage: {flush_interval: 200ms}
tiers:
  free:
    monthly_quota: 1000000
tools:
  llm: {cost: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "usage.db")
	us, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { us.Close() })
	r := testenv.StartRedis(t, nil)
	admin := r.Client(t)
	var es []*enforce.Engine
	var ms []*metrics.Metrics
	for range 2 {
		client := r.Client(t)
		st, err := redisstore.New(client, &redisstore.Options{Timeout: cfg.Store.Timeout})
		if err != nil {
			t.Fatal(err)
		}
		m := metrics.New()
		e, err := enforce.New(enforce.Options{Config: cfg, Usage: us, Shared: st, Metrics: m,
			Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		es, ms = append(es, e), append(ms, m)
	}

	var reached, denied atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			e := es[i%len(es)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				ticket, d := e.Admit(context.Background(), enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"})
				if !d.Allowed {
					denied.Add(1)
					ticket.Done(context.Background(), enforce.Outcome{})
					continue
				}
				reached.Add(1) // the call reaches the upstream
				ticket.Done(context.Background(), enforce.Outcome{})
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	before := reached.Load()
	fault(t, r, admin)
	// Traffic goes on until both engines use the store again and have
	// admitted more calls through it.
	deadline := time.Now().Add(30 * time.Second)
	for !(es[0].StoreAvailable() && es[1].StoreAvailable()) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, e := range es {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var degraded, unmetered float64
	for _, m := range ms {
		degraded += testutil.ToFloat64(m.Degraded.WithLabelValues("open"))
		unmetered += testutil.ToFloat64(m.Unmetered)
	}
	rec, ok, err := us.Get(context.Background(), "acme", usage.Period(time.Now()))
	if err != nil || !ok {
		t.Fatalf("durable usage: %v %v", ok, err)
	}
	n := reached.Load()
	t.Logf("%d calls reached the upstream (%d before the fault), %d denied, %d decisions degraded; durable %+v",
		n, before, denied.Load(), int64(degraded), rec.Usage)
	if rec.Usage.NetCalls() != n || rec.Usage.Used() != 3*n {
		t.Errorf("durable usage: %d calls, %d used; want %d calls and %d used (zero lost, zero doubled)",
			rec.Usage.NetCalls(), rec.Usage.Used(), n, 3*n)
	}
	if unmetered != 0 {
		t.Errorf("mcpgate_unmetered_calls_total = %v, want 0", unmetered)
	}
	if denied.Load() != 0 {
		t.Errorf("%d calls denied; the fault must not deny (on_error: open)", denied.Load())
	}
}
