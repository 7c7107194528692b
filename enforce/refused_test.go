package enforce

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// A store that answers one tenant's call with an error reply (here a key
// of the wrong type) is up: that tenant's call is refused (on_error: open
// does not admit what the store could not check), and the store breaker
// stays closed for every other tenant (counted as failures, one tenant's
// bad key used to take the store down for all, and on_error: open then
// admitted everyone unchecked).
func TestStoreRefusalIsNotAnOutage(t *testing.T) {
	e, client := redisEngine(t, testenv.StartRedis(t, nil), 2*time.Second, `store: {timeout: 2s, on_error: open}
breaker: {consecutive_denials: 5, cooldown: 1s}
tiers:
  free:
    limits:
      - {name: calls, per: tenant, algorithm: fixed_window, limit: 100, period: 1h}
default_tier: free
`)
	ctx := context.Background()
	// The bad tenant's breaker state is a string: the library's HMGET of
	// it gets WRONGTYPE.
	if err := client.Do(ctx, client.B().Set().Key(keyspace.Breaker("bad", "subject:a")).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		tk, d := e.Admit(ctx, Call{Tenant: "bad", Subject: "a", Name: "echo"})
		tk.Done(ctx, Outcome{})
		if d.Allowed || !d.Unavailable || d.Degraded != "" {
			t.Fatalf("bad tenant's call %d: %+v, want refused as unavailable, no failure policy", i, d)
		}
	}
	tk, d := e.Admit(ctx, Call{Tenant: "good", Subject: "a", Name: "echo"})
	tk.Done(ctx, Outcome{})
	if !d.Allowed || d.Degraded != "" {
		t.Fatalf("good tenant's call after the bad one's refusals: %+v, want admitted by the store", d)
	}
	if !e.guard.br.Available() {
		t.Error("the store breaker opened on error replies")
	}
	// The store's own error, as the engine sees it.
	_, err := e.guard.Evaluate(ctx, limit.Request{Checks: []limit.Check{{Rule: limit.Rule{Name: "r", Algorithm: limit.FixedWindow, Limit: 1, Period: time.Hour},
		Key: keyspace.Counter(keyspace.PerTenant, "fixed_window", "r", keyspace.Owner{Tenant: "bad"})}},
		Breaker: &limit.BreakerSpec{Key: keyspace.Breaker("bad", "subject:a"), Tenant: "bad", Subject: "a", ID: "subject:a",
			ConsecutiveDenials: 5, Cooldown: time.Second, MaxCooldown: time.Second, ProbeLease: time.Second}, Cost: 1})
	if !errors.Is(err, limit.ErrStoreRefused) {
		t.Errorf("Evaluate on a key of the wrong type: %v, want limit.ErrStoreRefused", err)
	}
}
