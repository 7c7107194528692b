package enforce_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
)

// dceb12a: "a call whose store request failed is refused by the breaker
// (stillOpen) rather than handed to the failure policy". evaluateMetered's
// knownOpen branch builds the breaker's batch but returns it with the
// store's error (err is only overwritten in the degrade branch), and judge
// turns any error into Unavailable: the call is answered as a store outage
// (503, Retry-After 1 s, CodeUnavailable in gosdk), not as the loop breaker
// (429 with the cooldown's Retry-After, scope breaker); the agent is told
// to retry in a second.
func TestKnownOpenBreakerAnsweredAsStoreUnavailable(t *testing.T) {
	redis := testenv.StartRedis(t, nil)
	cfg, err := policy.Parse("br.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {on_error: open, timeout: 1s}
breaker: {consecutive_failures: 2, cooldown: 10m}
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	client := redis.Client(t)
	st, err := redisstore.New(client, &redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Shared: st, Now: now,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "search"}
	for i := range 2 {
		ticket, d := e.Admit(t.Context(), call)
		if !d.Allowed {
			t.Fatalf("call %d: %+v", i, d)
		}
		ticket.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
	}
	if _, d := e.Admit(t.Context(), call); d.Allowed || d.Scope != enforce.ScopeBreaker {
		t.Fatalf("after 2 failures: %+v, want the breaker open", d)
	}
	mu.Lock()
	clock = clock.Add(2 * time.Second) // past the entry's hold: the store is asked again
	mu.Unlock()
	redis.Kill() // the store breaker is still closed: the call goes to the store and fails
	ticket, d := e.Admit(t.Context(), call)
	ticket.Done(t.Context(), enforce.Outcome{})
	if d.Allowed || d.Unavailable || d.Scope != enforce.ScopeBreaker {
		t.Fatalf("breaker known open (10m), store failed: allowed=%v unavailable=%v scope=%q retry_after=%v; want refused by the loop breaker (scope %q), not as a store outage",
			d.Allowed, d.Unavailable, d.Scope, d.Limit.RetryAfter, enforce.ScopeBreaker)
	}
}
