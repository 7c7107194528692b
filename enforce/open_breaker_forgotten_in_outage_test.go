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

// A loop breaker that opened (cooldown 10m) while Redis was up is known
// open to this instance (breakerCache holds its state and when it may
// close). When Redis then goes down, the breaker cache stops answering it
// after BreakerCacheHold (1 s, meant to re-ask the store for an admin
// reset), the store cannot be asked, and on_error (local here, open the
// same) admits every call: the runaway agent the breaker stopped runs
// freely for the whole outage, though this instance knows the breaker
// stays open for ~10 minutes more.
func TestOpenLoopBreakerForgottenDuringStoreOutage(t *testing.T) {
	redis := testenv.StartRedis(t, nil)
	cfg, err := policy.Parse("br.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {on_error: local, timeout: 1s}
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
	for i := range 2 { // two failures in a row open the breaker
		ticket, d := e.Admit(t.Context(), call)
		if !d.Allowed {
			t.Fatalf("call %d: %+v", i, d)
		}
		ticket.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
	}
	if _, d := e.Admit(t.Context(), call); d.Allowed || d.Scope != enforce.ScopeBreaker {
		t.Fatalf("after 2 failures: %+v, want the breaker open", d)
	}
	redis.Kill()
	mu.Lock()
	clock = clock.Add(2 * time.Second) // past BreakerCacheHold, far before the 10m cooldown
	mu.Unlock()
	admitted := 0
	for range 10 {
		ticket, d := e.Admit(t.Context(), call)
		if d.Allowed {
			admitted++
		}
		ticket.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
	}
	if admitted != 0 {
		t.Fatalf("the loop breaker opened for 10m 2s ago: %d of 10 calls admitted once the store went down, want 0", admitted)
	}
}
