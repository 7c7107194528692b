package enforce_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
)

// The other side of TestOpenLoopBreakerForgottenDuringStoreOutage: while
// the store can be asked, a breaker known open is answered in process for
// BreakerCacheHold only, so that a reset made elsewhere (another
// instance's DELETE /admin/breakers) is seen once the hold has passed.
func TestOpenLoopBreakerAskedAgainPastHoldWhileStoreUp(t *testing.T) {
	redis := testenv.StartRedis(t, nil)
	cfg, err := policy.Parse("br.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {on_error: local, timeout: 1s}
breaker: {consecutive_failures: 2, cooldown: 10m}
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
	// Reset in the store, as another instance's admin API would.
	var keys []string
	if err := st.ListBreakers(t.Context(), func(b limit.BreakerInfo) error { keys = append(keys, b.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Fatalf("breakers in the store: %v, want 1", keys)
	}
	if ok, err := st.ResetBreaker(t.Context(), keys[0]); err != nil || !ok {
		t.Fatalf("reset: %v %v", ok, err)
	}
	if _, d := e.Admit(t.Context(), call); d.Allowed {
		t.Fatalf("within the hold: %+v, want the breaker answered in process", d)
	}
	mu.Lock()
	clock = clock.Add(enforce.BreakerCacheHold + time.Millisecond)
	mu.Unlock()
	ticket, d := e.Admit(t.Context(), call)
	ticket.Done(t.Context(), enforce.Outcome{})
	if !d.Allowed {
		t.Fatalf("past the hold, the store up and the breaker reset there: %+v, want admitted", d)
	}
}
