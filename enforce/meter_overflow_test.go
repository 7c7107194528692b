package enforce_test

import (
	"context"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
)

// One tenant whose meter reaches limit.MaxUsage (a tool whose results
// report the largest cost the engine accepts, 2^40 units, 1024 times)
// has every later call refused: its meter can count no more. That is the
// meter's state, not the store's health: the store breaker must stay
// closed, and another tenant's calls be decided by the store (they used
// to be counted as store failures: three of them opened the breaker, and
// every tenant's calls were then decided by on_error, unmetered and
// unlimited under on_error: open).
func TestOneTenantsMeterOverflowIsNoStoreOutage(t *testing.T) {
	us := openSQLite(t)
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 1s, on_error: open}
usage: {flush_interval: 1h}
tiers:
  free: {}
tools:
  llm: {cost: {estimate: 1, from_result: "_meta.tokens"}}
`, enforce.Options{Usage: us, Shared: newSwappable(t), Probe: func(context.Context) error { return nil }})
	ctx := context.Background()
	big := enforce.Call{Tenant: "big", Subject: "a", Name: "llm"}
	full := false
	for range 1030 {
		tk, d := e.Admit(ctx, big)
		tk.Done(ctx, enforce.Outcome{Cost: 1 << 40})
		if !d.Allowed || d.Degraded != "" {
			full = true
			break
		}
	}
	if !full {
		t.Fatalf("the meter never reached limit.MaxUsage (%d)", int64(limit.MaxUsage))
	}
	// The overflowing tenant keeps calling: refused, not admitted by on_error.
	for i := range 3 {
		tk, d := e.Admit(ctx, big)
		tk.Done(ctx, enforce.Outcome{})
		if d.Allowed || !d.Unavailable || d.Degraded != "" {
			t.Errorf("overflowing tenant's call %d: %+v, want refused as unavailable, no failure policy", i, d)
		}
	}
	other := enforce.Call{Tenant: "other", Subject: "b", Name: "llm"}
	tk, d := e.Admit(ctx, other)
	tk.Done(ctx, enforce.Outcome{})
	if !d.Allowed || d.Degraded != "" || !e.StoreAvailable() {
		t.Errorf("another tenant's call: %+v, store available %v; want admitted by the store: one tenant's meter overflow opened the store breaker for everyone",
			d, e.StoreAvailable())
	}
}
