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
	env := newOutageEnv(t, `
store: {on_error: local, timeout: 1s}
breaker: {consecutive_failures: 2, cooldown: 10m}
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`, outageOptions{Clock: true})
	call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "search"}
	env.openBreaker(t, call, 2)
	env.redis.Kill()
	env.advance(2 * time.Second) // past BreakerCacheHold, far before the 10m cooldown
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
