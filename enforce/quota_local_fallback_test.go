package enforce_test

import (
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// Under on_error: local a quota is decided on the usage the store last
// reported plus this instance's usage admitted since (pending): a tenant
// with room left gets exactly that room during an outage, not more and not
// none (the other side of TestExhaustedQuotaAdmittedUnderLocalFallback).
func TestLocalFallbackAdmitsQuotaRoomLeft(t *testing.T) {
	env := newOutageEnv(t, `
store: {on_error: local, timeout: 1s}
tiers:
  free:
    monthly_quota: 5
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`, outageOptions{Usage: true})
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"}
	if n, last := env.admitN(t, call, 3); n != 3 || last.Degraded != "" {
		t.Fatalf("quota 5, Redis up: %d of 3 admitted, the last %+v", n, last)
	}
	env.redis.Kill()
	admitted, last := env.admitN(t, call, 10)
	if admitted != 2 {
		t.Fatalf("monthly quota 5, 3 used before Redis went down: %d of 10 admitted under on_error: local, want 2", admitted)
	}
	if last.Scope != enforce.ScopeQuota || last.Degraded != policy.FailLocal {
		t.Fatalf("the last call: %+v, want denied by the quota under on_error: local", last)
	}
}
