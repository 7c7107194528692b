package enforce_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
)

// ResetCounters clears budgets, not the calls running: a concurrency
// counter holds the slots of calls in flight, and dropping it let as many
// again run at once (limit 1: two in flight after a reset) until the
// first ones ended. The tenant's rate counters are cleared all the same.
func TestResetKeepsTheSlotsOfCallsInFlight(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			e := engines(t, store, 1, `
tools:
  slow:
    limits:
      - {name: one_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
      - {name: per_hour, per: tenant_tool, algorithm: fixed_window, limit: 2, period: 1h}
`, "")[0]
			ctx := context.Background()
			call := enforce.Call{Tenant: "acme", Subject: "a", Name: "slow", Arguments: json.RawMessage(`{}`)}
			running, d := e.Admit(ctx, call)
			if !d.Allowed {
				t.Fatalf("first call denied: %+v", d)
			}
			if _, _, err := e.ResetCounters(ctx, "acme", "", ""); err != nil {
				t.Fatal(err)
			}
			tk, d := e.Admit(ctx, call)
			tk.Done(ctx, enforce.Outcome{})
			if d.Allowed || d.Limit.Rule.Name != "one_at_a_time" {
				t.Fatalf("a second call while the first runs, after a reset: allowed %v by %q, want denied by one_at_a_time", d.Allowed, d.Limit.Rule.Name)
			}
			running.Done(ctx, enforce.Outcome{})
			// per_hour was cleared: two more calls pass, one after the other.
			for i := range 2 {
				tk, d := e.Admit(ctx, call)
				if !d.Allowed {
					t.Fatalf("call %d after the first ended: denied by %q", i, d.Limit.Rule.Name)
				}
				tk.Done(ctx, enforce.Outcome{})
			}
		})
	}
}
