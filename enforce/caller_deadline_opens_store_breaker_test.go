package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// The store breaker counts a call whose *caller's* context hit its
// deadline as a store failure (guardedStore.observe excludes only a
// cancelled caller), even when the store was never asked (redisstore
// checks ctx before any work). So one caller whose contexts carry a short
// deadline (a gosdk user's, any library user's) opens the limit store's
// breaker for every tenant with 3 calls, with Redis perfectly healthy:
// everyone is then decided by on_error (open by default: unlimited) until
// the probe closes it, and again after 3 more such calls.
func TestCallerDeadlineOpensStoreBreakerForAll(t *testing.T) {
	env := newOutageEnv(t, `
store: {on_error: open, timeout: 1s}
tiers:
  free:
    limits:
      - {name: hourly, per: tenant, algorithm: fixed_window, limit: 1, period: 1h}
`, outageOptions{})
	// One impatient caller: its deadline has passed when Admit runs.
	for i := range 3 {
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Millisecond))
		ticket, d := env.e.Admit(ctx, enforce.Call{Tenant: "impatient", Subject: "x", Name: "search"})
		ticket.Done(t.Context(), enforce.Outcome{})
		cancel()
		if d.Allowed {
			t.Fatalf("impatient call %d admitted: %+v", i, d)
		}
	}
	// Another tenant, limit 1 an hour, Redis healthy all along.
	admitted, last := env.admitN(t, enforce.Call{Tenant: "acme", Subject: "a", Name: "search"}, 5)
	if admitted != 1 {
		t.Fatalf("Redis up, acme limited to 1/h: %d of 5 admitted (store breaker open: %v, last degraded %q) after another caller's 3 expired contexts", admitted, !env.e.StoreAvailable(), last.Degraded)
	}
}
