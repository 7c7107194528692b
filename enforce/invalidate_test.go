package enforce_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
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

// An invalidation that fails on a Redis cache is remembered and replayed
// for every scope it was meant for: the tenant's entries and the shared
// ones its tags reach. A failure of the tenant's scope used to return
// before the shared scope was asked, so nothing remembered it and, once
// the store answered again, every instance served the shared entry the
// mutation made stale until its TTL.
func TestFailedInvalidationIsReplayedForEveryScope(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	cs, err := cache.NewRedisStore(r.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(cs, &cache.Options{Timeout: time.Second, ProbeInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
tools:
  search:
    cache: {ttl: 10m, tags: ["product:{{args.id}}"]}
  catalog:
    cache: {ttl: 10m, shared: true, tags: ["product:{{args.id}}"]}
  update_product: {invalidates: ["product:{{args.id}}"]}
`, enforce.Options{Cache: c})
	ctx := context.Background()
	// read returns what a cached call of tool for product 42 gets, loading
	// load on a miss.
	read := func(tool, load string) string {
		t.Helper()
		tk, d := e.Admit(ctx, enforce.Call{Tenant: "acme", Subject: "a", Name: tool, Arguments: json.RawMessage(`{"id":"42"}`)})
		if !d.Allowed {
			t.Fatalf("%s denied: %+v", tool, d)
		}
		defer tk.Done(ctx, enforce.Outcome{})
		plan, ok := tk.CachePlan()
		if !ok {
			t.Fatalf("%s has no cache plan", tool)
		}
		entry, _, err := c.Get(ctx, plan.Key, func(context.Context) ([]byte, bool, error) { return []byte(load), false, nil }, plan.Policy)
		if err != nil {
			t.Fatal(err)
		}
		return string(entry.Value)
	}
	entries := []struct{ name, tool string }{
		{"tenant's entry", "search"},
		{"shared entry", "catalog"},
	}
	for _, en := range entries {
		if v := read(en.tool, "old"); v != "old" {
			t.Fatalf("%s: first read %q", en.name, v)
		}
	}
	// The invalidation fails: its context ended (the mutating call's
	// client left), as a timeout or an open breaker would make it.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Invalidate(gone, "acme", []string{"product:42"}); err == nil {
		t.Fatal("an invalidation with an ended context succeeded")
	}
	if st := c.Stats(); st.FailedInvalidations != int64(len(entries)) {
		t.Errorf("%d failed (scope, tag) pairs remembered, want %d (one per scope): %+v", st.FailedInvalidations, len(entries), st)
	}
	// The store answers: the probe replays what was remembered, then
	// closes the breaker.
	for !c.StoreAvailable() {
		time.Sleep(10 * time.Millisecond)
	}
	for _, en := range entries {
		if v := read(en.tool, "new"); v != "new" {
			t.Errorf("%s tagged product:42 served (%q) after the failed Invalidate(acme, product:42) was replayed", en.name, v)
		}
	}
}
