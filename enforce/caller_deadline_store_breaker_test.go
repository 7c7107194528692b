package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// Calls whose *caller's* context hit its deadline (a gosdk user's, any
// library user's) do not open the limit store's breaker while Redis is
// healthy: after one caller's 3 expired contexts, another tenant is still
// decided by the store (limit 1 an hour: 1 of 5 admitted), not by on_error.
// (Once, such a call counted as a store failure even when the store was
// never asked, and 3 of them opened the breaker for every tenant.)
func TestCallerDeadlineLeavesStoreBreakerClosed(t *testing.T) {
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
