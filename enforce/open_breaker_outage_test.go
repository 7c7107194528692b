package enforce_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// A loop breaker that opened (cooldown 10m) while Redis was up stays open
// to this instance when Redis goes down: past BreakerCacheHold, far before
// the cooldown's end, every call is still refused, not admitted by on_error
// (local here). (Once, the breaker cache stopped answering it after
// BreakerCacheHold and the runaway agent ran freely for the whole outage.)
func TestOpenLoopBreakerHeldDuringStoreOutage(t *testing.T) {
	env := newOutageEnv(t, openBreakerOutageConfig("local"), outageOptions{Clock: true})
	call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "search"}
	env.openBreaker(t, call, 2)
	env.redis.Kill()
	env.clock.Advance(2 * time.Second) // past BreakerCacheHold, far before the 10m cooldown
	admitted := 0
	for range 10 {
		ticket, d := env.e.Admit(t.Context(), call)
		if d.Allowed {
			admitted++
		}
		ticket.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
	}
	if admitted != 0 {
		t.Fatalf("the loop breaker opened for 10m 2s ago: %d of 10 calls admitted once the store went down, want 0", admitted)
	}
}

// openBreakerOutageConfig is the configuration of the tests of a loop
// breaker known open (cooldown 10m) when the store fails, under on_error
// onErr.
func openBreakerOutageConfig(onErr string) string {
	return `
store: {on_error: ` + onErr + `, timeout: 1s}
breaker: {consecutive_failures: 2, cooldown: 10m}
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`
}

// A call to a breaker known open whose store request failed is refused by
// the loop breaker (scope breaker: 429 with the cooldown's Retry-After),
// not answered as a store outage (Unavailable: 503, Retry-After 1 s). (Once,
// evaluateMetered's knownOpen branch returned the store's error with the
// breaker's batch and judge turned it into Unavailable: the agent was told
// to retry in a second.)
func TestKnownOpenBreakerRefusesWhenStoreFails(t *testing.T) {
	env := newOutageEnv(t, openBreakerOutageConfig("open"), outageOptions{Clock: true})
	call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "search"}
	env.openBreaker(t, call, 2)
	env.clock.Advance(2 * time.Second) // past the entry's hold: the store is asked again
	env.redis.Kill()                   // the store breaker is still closed: the call goes to the store and fails
	ticket, d := env.e.Admit(t.Context(), call)
	ticket.Done(t.Context(), enforce.Outcome{})
	if d.Allowed || d.Unavailable || d.Scope != enforce.ScopeBreaker {
		t.Fatalf("breaker known open (10m), store failed: allowed=%v unavailable=%v scope=%q retry_after=%v; want refused by the loop breaker (scope %q), not as a store outage",
			d.Allowed, d.Unavailable, d.Scope, d.Limit.RetryAfter, enforce.ScopeBreaker)
	}
}
