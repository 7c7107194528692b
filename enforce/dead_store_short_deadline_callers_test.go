package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// A store that does not answer at all opens the store breaker even when
// every caller's deadline is shorter than store.timeout (an embedding
// server, gosdk, that bounds its handlers), so on_error decides the calls
// that follow. (Once, from 66a078c, such deadlines did not count and the
// breaker never opened: each call waited out its own deadline in the store
// and was refused Unavailable for the whole outage.)
func TestDeadStoreOpensBreakerForShortDeadlineCallers(t *testing.T) {
	env := newOutageEnv(t, `
store: {on_error: open, timeout: 1s}
tiers:
  free:
    limits:
      - {name: hourly, per: tenant, algorithm: fixed_window, limit: 100, period: 1h}
`, outageOptions{Proxy: true})
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "search"}
	if n, last := env.admitN(t, call, 1); n != 1 {
		t.Fatalf("warm-up: %+v", last)
	}
	// The store stops answering (a black hole: every answer 60 s late).
	env.proxy.AddToxic(t, testenv.Toxic{Name: "dead", Type: "latency", Attributes: map[string]any{"latency": 60000}})

	const calls = 4 * enforce.DefaultStoreFailures
	unavailable := 0
	start := time.Now()
	for range calls {
		// Every caller bounds its handler to 200 ms (< store.timeout).
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		tk, d := env.e.Admit(ctx, call)
		cancel()
		tk.Done(t.Context(), enforce.Outcome{})
		if d.Unavailable {
			unavailable++
		}
	}
	if env.e.StoreAvailable() {
		t.Fatalf("store dead, %d calls took %v (each waited out its 200ms deadline in the dead store; %d refused Unavailable, the rest admitted by on_error only once their deadline had passed): the store breaker is still closed, want it open after %d",
			calls, time.Since(start).Round(100*time.Millisecond), unavailable, enforce.DefaultStoreFailures)
	}
}
