package keyspace

import (
	"strings"
	"testing"
)

func TestSessionKeys(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{TenantSessions("acme"), "mcpgate:sess:{acme}:tenant"},
		{SubjectSessions("acme", "alice"), "mcpgate:sess:{acme}:subject:alice"},
		{SubjectSessions("a}b", "x:y"), "mcpgate:sess:{a%7Db}:subject:x%3Ay"},
		{TenantSessions(""), "mcpgate:sess:{~}:tenant"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// FuzzSessionKeys: session keys are injective, in their tenant's slot, and
// never a rate-limit counter's key.
func FuzzSessionKeys(f *testing.F) {
	f.Add("acme", "alice", "acme", "bob")
	f.Add("a}b", "s", "a", "}b:s")
	f.Add("x:y", "", "x", "y:")
	f.Add("", "tenant", "", "")
	f.Add("a", "b:subject:c", "a", "b")
	f.Fuzz(func(t *testing.T, tenant1, subject1, tenant2, subject2 string) {
		tk1, sk1 := TenantSessions(tenant1), SubjectSessions(tenant1, subject1)
		tk2, sk2 := TenantSessions(tenant2), SubjectSessions(tenant2, subject2)
		for _, k := range []string{tk1, sk1} {
			if HashTag(k) != Escape(tenant1) {
				t.Fatalf("key %q: hash tag %q, want %q", k, HashTag(k), Escape(tenant1))
			}
			if !strings.HasPrefix(k, Prefix+"sess:{") {
				t.Fatalf("key %q outside the sessions space", k)
			}
		}
		if tk1 == sk1 || tk1 == sk2 || sk1 == tk2 {
			t.Fatalf("a tenant key equals a subject key: %q %q %q %q", tk1, sk1, tk2, sk2)
		}
		if (tk1 == tk2) != (tenant1 == tenant2) {
			t.Fatalf("tenants %q, %q: keys %q, %q", tenant1, tenant2, tk1, tk2)
		}
		if (sk1 == sk2) != (tenant1 == tenant2 && subject1 == subject2) {
			t.Fatalf("(%q, %q) and (%q, %q): keys %q, %q", tenant1, subject1, tenant2, subject2, sk1, sk2)
		}
		for _, p := range scopes {
			if rl := RateLimit(p, subject1, Owner{Tenant: tenant1, Subject: subject1, Tool: subject2}); rl == tk1 || rl == sk1 {
				t.Fatalf("rate-limit key %q equals a session key", rl)
			}
		}
	})
}
