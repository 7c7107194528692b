package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
)

// An upstream's rule per tenant counts every tool of the upstream, listed
// under tools: or not: Counters shows it and ResetCounters clears it (both
// saw only the rules of listed tools).
func TestCountersOfAnUpstreamRule(t *testing.T) {
	e := newEngine(t, `upstreams:
  - name: search
    url: "http://127.0.0.1:1/mcp"
    limits:
      - {name: search_calls, per: tenant, algorithm: fixed_window, limit: 1, period: 1h}
  - name: files
    url: "http://127.0.0.1:2/mcp"
`, enforce.Options{})
	ctx := t.Context()
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "search__query"}
	admit := func(want bool) {
		t.Helper()
		tk, d := e.Admit(ctx, call)
		tk.Done(ctx, enforce.Outcome{})
		if d.Allowed != want {
			t.Fatalf("allowed %v, want %v (%+v)", d.Allowed, want, d)
		}
	}
	admit(true)
	admit(false)
	cs, err := e.Counters(ctx, "", "acme", "")
	if err != nil {
		t.Fatal(err)
	}
	shown := false
	for _, c := range cs {
		shown = shown || c.Rule.Name == "search_calls" && c.Result.Remaining == 0
	}
	if !shown {
		t.Errorf("Counters does not show the upstream rule search_calls, spent: %+v", cs)
	}
	if _, _, err := e.ResetCounters(ctx, "acme", "", ""); err != nil {
		t.Fatal(err)
	}
	admit(true)
}

// While the shared store is down, a reset clears the local fallback's
// counters (deciding calls under on_error: local) and reports the shared
// store's failure: it stopped at that failure, leaving the tenant denied.
func TestResetCountersWithTheSharedStoreDown(t *testing.T) {
	rd := testenv.StartRedis(t, nil)
	client := rd.Client(t)
	st, err := redisstore.New(client, &redisstore.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {on_error: local, timeout: 200ms}
tiers:
  free:
    limits:
      - {name: per_hour, per: tenant, algorithm: fixed_window, limit: 1, period: 1h}
`, enforce.Options{Shared: st,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
	rd.Kill()
	ctx := context.Background()
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "echo"}
	admit := func() enforce.Decision {
		tk, d := e.Admit(ctx, call)
		tk.Done(ctx, enforce.Outcome{})
		return d
	}
	testenv.Eventually(t, 10*time.Second, "the store breaker to open", func() bool { admit(); return !e.StoreAvailable() })
	if d := admit(); d.Allowed {
		t.Fatalf("the local counter does not deny yet: %+v", d)
	}
	if _, _, err := e.ResetCounters(ctx, "acme", "", ""); err == nil {
		t.Error("ResetCounters reported no error with the shared store down")
	}
	if d := admit(); !d.Allowed {
		t.Errorf("after the reset the local counter still denies: %+v", d)
	}
}
