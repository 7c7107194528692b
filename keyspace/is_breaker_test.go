package keyspace

import (
	"strings"
	"testing"
)

// IsBreaker accepts every key Breaker builds, the digest forms
// of long components included, and no key of another kind.
func TestIsBreaker(t *testing.T) {
	long := strings.Repeat("t", MaxComponent+1)
	for _, key := range []string{
		Breaker("acme", "subject:alice"),
		Breaker("", ""),
		Breaker(long, "subject:"+long),
		Breaker("a{b}:c", "session:{x}"),
	} {
		if !IsBreaker(key) {
			t.Errorf("IsBreaker(%q) = false, want true", key)
		}
	}
	for _, key := range []string{
		"", "x", "mcpgate:br:", "mcpgate:br:{acme}", "mcpgate:br:{acme}:", "mcpgate:br:{}:x", "mcpgate:br:{a:b}:x",
		BreakerCall("acme", "subject:alice", "f"),
		Counter(PerTenant, "fixed_window", "r", Owner{Tenant: "acme"}),
		Usage("acme", "2026-11"),
		TenantSessions("acme"),
		CacheEntry(TenantCache("acme"), "echo", "h"),
	} {
		if IsBreaker(key) {
			t.Errorf("IsBreaker(%q) = true, want false", key)
		}
	}
}
