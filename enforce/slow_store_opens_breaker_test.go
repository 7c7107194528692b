package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// The other side of TestCallerDeadlineLeavesStoreBreakerClosed: a store
// that answers past store.timeout opens the breaker, whether the caller set
// no deadline or a longer one (the store's own timeout ends their calls,
// and counts). Callers whose own shorter deadline ends their calls open it
// too, through the check they start (TestDeadStoreOpensBreakerForShortDeadlineCallers).
func TestSlowStoreOpensBreaker(t *testing.T) {
	env := newOutageEnv(t, `
store: {on_error: closed, timeout: 200ms}
tiers:
  free:
    limits:
      - {name: hourly, per: tenant, algorithm: fixed_window, limit: 100, period: 1h}
`, outageOptions{Proxy: true, Timeout: 200 * time.Millisecond})
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "search"}
	admit := func(ctx context.Context) enforce.Decision {
		ticket, d := env.e.Admit(ctx, call)
		ticket.Done(t.Context(), enforce.Outcome{})
		return d
	}
	if d := admit(t.Context()); !d.Allowed {
		t.Fatalf("warm-up: %+v", d)
	}
	// Every answer comes 2 s late: past store.timeout.
	env.proxy.AddToxic(t, testenv.Toxic{Name: "slow", Type: "latency", Attributes: map[string]any{"latency": 2000}})
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
	if env.e.StoreAvailable() {
		t.Fatalf("%d calls timed out by store.timeout: the store breaker is still closed", enforce.DefaultStoreFailures)
	}
}
