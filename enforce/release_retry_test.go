package enforce

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/redis/rueidis"
)

// A concurrency slot whose release failed (the store breaker open when
// the call ended, so the release was not even sent) is released once the
// store answers again, not an hour later when its lease expires: the
// tenant's next call is admitted.
func TestFailedReleaseIsTriedAgain(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	e, _ := redisEngine(t, r, 300*time.Millisecond, `store: {timeout: 300ms, on_error: closed}
tiers:
  free:
    limits:
      - {name: inflight, per: tenant, algorithm: concurrency, limit: 1, period: 1h}
default_tier: free
`)
	ctx := context.Background()
	call := Call{Tenant: "acme", Subject: "a", Name: "echo"}
	var tk *Ticket
	testenv.Eventually(t, 10*time.Second, "the first call to be admitted by the store", func() bool {
		var d Decision
		tk, d = e.Admit(ctx, call)
		if !d.Allowed {
			tk.Done(ctx, Outcome{})
		}
		return d.Allowed
	})
	thaw := r.Freeze(t)
	testenv.Eventually(t, 20*time.Second, "the store breaker to open", func() bool {
		other, _ := e.Admit(ctx, Call{Tenant: "other", Subject: "a", Name: "echo"})
		other.Done(ctx, Outcome{})
		return !e.guard.br.Available()
	})
	tk.Done(ctx, Outcome{}) // its release is refused by the open breaker
	thaw()
	testenv.Eventually(t, 20*time.Second, "the slot to be released and a new call admitted", func() bool {
		tk, d := e.Admit(ctx, call)
		tk.Done(ctx, Outcome{})
		return d.Allowed
	})
}

// redisEngine is an engine on r (its store's timeout storeTimeout) with
// the config yaml after the upstream and auth sections, closed with the
// test, and a client of r of its own.
func redisEngine(t *testing.T, r *testenv.Redis, storeTimeout time.Duration, yaml string) (*Engine, rueidis.Client) {
	t.Helper()
	client := r.Client(t)
	rs, err := redisstore.New(client, &redisstore.Options{Timeout: storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	cfg, err := policy.Parse("x.yaml", []byte("upstream: {url: \"http://127.0.0.1:1/mcp\"}\nauth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}\n"+yaml))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Config: cfg, Shared: rs, Metrics: metrics.New(), Logger: slog.New(slog.DiscardHandler),
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, r.Client(t)
}
