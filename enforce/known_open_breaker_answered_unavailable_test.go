package enforce_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// dceb12a: "a call whose store request failed is refused by the breaker
// (stillOpen) rather than handed to the failure policy". evaluateMetered's
// knownOpen branch builds the breaker's batch but returns it with the
// store's error (err is only overwritten in the degrade branch), and judge
// turns any error into Unavailable: the call is answered as a store outage
// (503, Retry-After 1 s, CodeUnavailable in gosdk), not as the loop breaker
// (429 with the cooldown's Retry-After, scope breaker); the agent is told
// to retry in a second.
func TestKnownOpenBreakerAnsweredAsStoreUnavailable(t *testing.T) {
	env := newOutageEnv(t, `
store: {on_error: open, timeout: 1s}
breaker: {consecutive_failures: 2, cooldown: 10m}
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`, outageOptions{Clock: true})
	call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "search"}
	env.openBreaker(t, call, 2)
	env.advance(2 * time.Second) // past the entry's hold: the store is asked again
	env.redis.Kill()             // the store breaker is still closed: the call goes to the store and fails
	ticket, d := env.e.Admit(t.Context(), call)
	ticket.Done(t.Context(), enforce.Outcome{})
	if d.Allowed || d.Unavailable || d.Scope != enforce.ScopeBreaker {
		t.Fatalf("breaker known open (10m), store failed: allowed=%v unavailable=%v scope=%q retry_after=%v; want refused by the loop breaker (scope %q), not as a store outage",
			d.Allowed, d.Unavailable, d.Scope, d.Limit.RetryAfter, enforce.ScopeBreaker)
	}
}
