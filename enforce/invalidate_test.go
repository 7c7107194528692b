package enforce_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
)

// A mutating tool's call drops the entries it makes stale whenever it may
// have written: answered (OK), cancelled, abandoned, or without an answer
// (Failed: a timeout or a 5xx, the write may have landed); only a tool
// error, which says it did not, keeps them.
func TestInvalidationByOutcome(t *testing.T) {
	e := engines(t, "memory", 1, `
tools:
  search:
    cache: {ttl: 10m, tags: ["product:{{args.query}}"]}
  update_product: {invalidates: ["product:{{args.id}}"]}
`, "")[0]
	ctx := context.Background()
	// read returns what a cached search for product 42 gets, loading load
	// on a miss.
	read := func(load string) string {
		t.Helper()
		tk, d := e.Admit(ctx, enforce.Call{Tenant: "acme", Subject: "a", Name: "search", Arguments: json.RawMessage(`{"query":"42"}`)})
		if !d.Allowed {
			t.Fatalf("search denied: %+v", d)
		}
		defer tk.Done(ctx, enforce.Outcome{})
		plan, ok := tk.CachePlan()
		if !ok {
			t.Fatal("search has no cache plan")
		}
		entry, _, err := e.Cache().Get(ctx, plan.Key, func(context.Context) ([]byte, bool, error) { return []byte(load), false, nil }, plan.Policy)
		if err != nil {
			t.Fatal(err)
		}
		return string(entry.Value)
	}
	for _, c := range []struct {
		name   string
		status enforce.Status
		drops  bool
	}{
		{"ok", enforce.OK, true},
		{"tool error", enforce.ToolError, false},
		{"failed", enforce.Failed, true},
		{"cancelled", enforce.Cancelled, true},
		{"abandoned", enforce.Abandoned, true},
	} {
		before := read("before " + c.name)
		tk, d := e.Admit(ctx, enforce.Call{Tenant: "acme", Subject: "a", Name: "update_product", Arguments: json.RawMessage(`{"id":"42"}`)})
		if !d.Allowed {
			t.Fatalf("%s: update_product denied: %+v", c.name, d)
		}
		tk.Done(ctx, enforce.Outcome{Status: c.status})
		after := read("after " + c.name)
		if dropped := after != before; dropped != c.drops {
			t.Errorf("%s: read %q after the update (before it %q): dropped %v, want %v", c.name, after, before, dropped, c.drops)
		}
	}
}
