package enforce_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// Under on_error: local a quota is decided on the usage the store last
// reported plus this instance's usage admitted since (pending): a tenant
// with room left gets exactly that room during an outage, not more and not
// none (the other side of TestExhaustedQuotaAdmittedUnderLocalFallback).
func TestLocalFallbackAdmitsQuotaRoomLeft(t *testing.T) {
	redis := testenv.StartRedis(t, nil)
	cfg, err := policy.Parse("q.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {on_error: local, timeout: 1s}
tiers:
  free:
    monthly_quota: 5
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	us, err := sqlite.Open(filepath.Join(t.TempDir(), "u.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { us.Close() })
	client := redis.Client(t)
	st, err := redisstore.New(client, &redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Shared: st, Usage: us,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"}
	for i := range 3 {
		ticket, d := e.Admit(t.Context(), call)
		if !d.Allowed || d.Degraded != "" {
			t.Fatalf("call %d, Redis up: %+v", i, d)
		}
		ticket.Done(t.Context(), enforce.Outcome{})
	}
	redis.Kill()
	admitted := 0
	var last enforce.Decision
	for range 10 {
		ticket, d := e.Admit(t.Context(), call)
		if d.Allowed {
			admitted++
		}
		last = d
		ticket.Done(t.Context(), enforce.Outcome{})
	}
	if admitted != 2 {
		t.Fatalf("monthly quota 5, 3 used before Redis went down: %d of 10 admitted under on_error: local, want 2", admitted)
	}
	if last.Scope != enforce.ScopeQuota || last.Degraded != policy.FailLocal {
		t.Fatalf("the last call: %+v, want denied by the quota under on_error: local", last)
	}
}
