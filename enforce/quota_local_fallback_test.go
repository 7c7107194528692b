package enforce_test

import (
	"fmt"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// Under on_error: local a quota is decided on the usage the store last
// reported plus this instance's usage admitted since (pending): a tenant
// with room left gets exactly that room during an outage, not more and not
// none (the other side of TestExhaustedQuotaDeniedUnderLocalFallback).
func TestLocalFallbackAdmitsQuotaRoomLeft(t *testing.T) {
	env := newOutageEnv(t, localFallbackQuotaConfig(5), outageOptions{Usage: true})
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

// localFallbackQuotaConfig is the configuration of the tests of a monthly
// quota under on_error: local.
func localFallbackQuotaConfig(quota int) string {
	return fmt.Sprintf(`
store: {on_error: local, timeout: 1s}
tiers:
  free:
    monthly_quota: %d
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`, quota)
}

// A tenant that has used up its monthly quota (the store just denied it
// with scope quota) stays denied when Redis goes down under on_error: local,
// which "decides with the in-process store and the same rules" (the docs).
// (Once, the fallback evaluated the rate rules only, dropped the meter, and
// admitted every call.)
func TestExhaustedQuotaDeniedUnderLocalFallback(t *testing.T) {
	env := newOutageEnv(t, localFallbackQuotaConfig(3), outageOptions{Usage: true})
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"}
	if n, last := env.admitN(t, call, 4); n != 3 || last.Scope != enforce.ScopeQuota {
		t.Fatalf("quota 3, Redis up: %d of 4 admitted, the last %+v; want 3, the 4th denied by the quota", n, last)
	}
	env.redis.Kill()
	if admitted, _ := env.admitN(t, call, 10); admitted != 0 {
		t.Fatalf("monthly quota 3 used up (3 admitted, the 4th denied): %d of 10 more admitted under on_error: local once Redis went down, want 0", admitted)
	}
}
