package enforce_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
)

// The other side of TestOpenLoopBreakerHeldDuringStoreOutage: while
// the store can be asked, a breaker known open is answered in process for
// BreakerCacheHold only, so that a reset made elsewhere (another
// instance's DELETE /admin/breakers) is seen once the hold has passed.
func TestOpenLoopBreakerAskedAgainPastHoldWhileStoreUp(t *testing.T) {
	env := newOutageEnv(t, `
store: {on_error: local, timeout: 1s}
breaker: {consecutive_failures: 2, cooldown: 10m}
`, outageOptions{Clock: true})
	call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "search"}
	env.openBreaker(t, call, 2)
	// Reset in the store, as another instance's admin API would.
	var keys []string
	if err := env.st.ListBreakers(t.Context(), func(b limit.BreakerInfo) error { keys = append(keys, b.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Fatalf("breakers in the store: %v, want 1", keys)
	}
	if ok, err := env.st.ResetBreaker(t.Context(), keys[0]); err != nil || !ok {
		t.Fatalf("reset: %v %v", ok, err)
	}
	if _, d := env.e.Admit(t.Context(), call); d.Allowed {
		t.Fatalf("within the hold: %+v, want the breaker answered in process", d)
	}
	env.clock.Advance(enforce.BreakerCacheHold + time.Millisecond)
	ticket, d := env.e.Admit(t.Context(), call)
	ticket.Done(t.Context(), enforce.Outcome{})
	if !d.Allowed {
		t.Fatalf("past the hold, the store up and the breaker reset there: %+v, want admitted", d)
	}
}
