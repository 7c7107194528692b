package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
)

// The other side of TestCallerDeadlineOpensStoreBreakerForAll: a store
// that answers past store.timeout still opens the breaker, whether the
// caller set no deadline or a longer one; only a timeout of the caller's
// own, shorter deadline is not the store's failure.
func TestSlowStoreOpensBreakerCallerDeadlineDoesNot(t *testing.T) {
	redis := testenv.StartRedis(t, nil)
	proxy := testenv.StartToxiproxy(t, redis.Addr)
	cfg, err := policy.Parse("s.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {on_error: closed, timeout: 200ms}
tiers:
  free:
    limits:
      - {name: hourly, per: tenant, algorithm: fixed_window, limit: 100, period: 1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	opt := redis.ClientOption()
	opt.InitAddress = []string{proxy.Addr}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	st, err := redisstore.New(client, &redisstore.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Shared: st,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "search"}
	admit := func(ctx context.Context) enforce.Decision {
		ticket, d := e.Admit(ctx, call)
		ticket.Done(t.Context(), enforce.Outcome{})
		return d
	}
	if d := admit(t.Context()); !d.Allowed {
		t.Fatalf("warm-up: %+v", d)
	}
	// Every answer comes 2 s late: past store.timeout.
	proxy.AddToxic(t, testenv.Toxic{Name: "slow", Type: "latency", Attributes: map[string]any{"latency": 2000}})

	// Callers whose own deadline (20 ms) ends the call long before the
	// store's: their timeouts are theirs.
	for i := range 2 * enforce.DefaultStoreFailures {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		d := admit(ctx)
		cancel()
		if d.Allowed {
			t.Fatalf("impatient call %d admitted: %+v", i, d)
		}
	}
	if !e.StoreAvailable() {
		t.Fatal("the store breaker opened on timeouts of the callers' own deadlines, shorter than store.timeout")
	}

	// Callers with no deadline, or one longer than store.timeout: the
	// store's own timeout ends their calls, and counts.
	for i := range enforce.DefaultStoreFailures {
		ctx, cancel := t.Context(), context.CancelFunc(func() {})
		if i%2 == 1 {
			ctx, cancel = context.WithTimeout(t.Context(), time.Minute)
		}
		d := admit(ctx)
		cancel()
		if d.Allowed || !d.Unavailable {
			t.Fatalf("slow store, on_error: closed: call %d: %+v, want 503", i, d)
		}
	}
	if e.StoreAvailable() {
		t.Fatalf("%d calls timed out by store.timeout: the store breaker is still closed", enforce.DefaultStoreFailures)
	}
}
