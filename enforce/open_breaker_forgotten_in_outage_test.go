package enforce_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// A loop breaker that opened (cooldown 10m) while Redis was up is known
// open to this instance (breakerCache holds its state and when it may
// close). When Redis then goes down, the breaker cache stops answering it
// after BreakerCacheHold (1 s, meant to re-ask the store for an admin
// reset), the store cannot be asked, and on_error (local here, open the
// same) admits every call: the runaway agent the breaker stopped runs
// freely for the whole outage, though this instance knows the breaker
// stays open for ~10 minutes more.
func TestOpenLoopBreakerForgottenDuringStoreOutage(t *testing.T) {
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

// dceb12a: "a call whose store request failed is refused by the breaker
// (stillOpen) rather than handed to the failure policy". evaluateMetered's
// knownOpen branch builds the breaker's batch but returns it with the
// store's error (err is only overwritten in the degrade branch), and judge
// turns any error into Unavailable: the call is answered as a store outage
// (503, Retry-After 1 s, CodeUnavailable in gosdk), not as the loop breaker
// (429 with the cooldown's Retry-After, scope breaker); the agent is told
// to retry in a second.
func TestKnownOpenBreakerAnsweredAsStoreUnavailable(t *testing.T) {
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
