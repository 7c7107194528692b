package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEscape(t *testing.T) {
	long := strings.Repeat("x", MaxComponent)
	tests := []struct {
		in, want string
	}{
		{"", "~"},
		{"acme", "acme"},
		{"Acme-Corp_01.eu@x", "Acme-Corp_01.eu@x"},
		{"a:b", "a%3Ab"},
		{"a%3Ab", "a%253Ab"},
		{"a}b", "a%7Db"},
		{"{", "%7B"},
		{"}", "%7D"},
		{"~", "%7E"},
		{"~g", "%7Eg"},
		{"~h0123", "%7Eh0123"},
		{" /", "%20%2F"},
		{"\xff\xfe", "%FF%FE"},
		{"é", "%C3%A9"},
		{"\x00", "%00"},
		{long, long}, // exactly MaxComponent: kept verbatim
	}
	for _, tt := range tests {
		if got := Escape(tt.in); got != tt.want {
			t.Errorf("Escape(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestEscapeDigest(t *testing.T) {
	digest := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "~h" + hex.EncodeToString(sum[:16])
	}
	for _, in := range []string{
		strings.Repeat("x", MaxComponent+1),
		strings.Repeat(":", MaxComponent/3+1), // 33 bytes, 99 escaped
		strings.Repeat("a", 10000),
	} {
		got := Escape(in)
		if got != digest(in) {
			t.Errorf("Escape(%d bytes) = %q, want the digest %q", len(in), got, digest(in))
		}
		if len(got) != 34 {
			t.Errorf("digest form has %d bytes, want 34", len(got))
		}
	}
	// 32 colons escape to exactly 96 bytes: still verbatim.
	if got, want := Escape(strings.Repeat(":", 32)), strings.Repeat("%3A", 32); got != want {
		t.Errorf("Escape(32 colons) = %q, want %q", got, want)
	}
	if Escape(strings.Repeat("a", 10000)) == Escape(strings.Repeat("a", 10001)) {
		t.Error("two long inputs share a digest")
	}
}

func TestRateLimit(t *testing.T) {
	o := Owner{Tenant: "acme", Subject: "alice", Tool: "search"}
	tests := []struct {
		per  Per
		o    Owner
		want string
	}{
		{PerGlobal, o, "mcpgate:rl:{~g}:global:r"},
		{PerTenant, o, "mcpgate:rl:{acme}:tenant:r"},
		{PerTenantTool, o, "mcpgate:rl:{acme}:tenant_tool:r:search"},
		{PerSubject, o, "mcpgate:rl:{acme}:subject:r:alice"},
		{PerSubjectTool, o, "mcpgate:rl:{acme}:subject_tool:r:alice:search"},
		{PerTenant, Owner{Tenant: "a}b"}, "mcpgate:rl:{a%7Db}:tenant:r"},
		{PerTenant, Owner{Tenant: ""}, "mcpgate:rl:{~}:tenant:r"},
		{PerTenant, Owner{Tenant: "~g"}, "mcpgate:rl:{%7Eg}:tenant:r"},
		{PerSubjectTool, Owner{Tenant: "x:y", Subject: "{s}", Tool: ""}, "mcpgate:rl:{x%3Ay}:subject_tool:r:%7Bs%7D:~"},
	}
	for _, tt := range tests {
		if got := RateLimit(tt.per, "r", tt.o); got != tt.want {
			t.Errorf("RateLimit(%s, r, %+v) = %q, want %q", tt.per, tt.o, got, tt.want)
		}
	}
	// A global key ignores the owner; the tenant does not leak into it.
	if a, b := RateLimit(PerGlobal, "r", Owner{Tenant: "a"}), RateLimit(PerGlobal, "r", Owner{Tenant: "b"}); a != b {
		t.Errorf("global keys differ by tenant: %q, %q", a, b)
	}
	// The tenant "~g" must not share the global slot's tag.
	if HashTag(RateLimit(PerTenant, "r", Owner{Tenant: "~g"})) == HashTag(RateLimit(PerGlobal, "r", Owner{})) {
		t.Error(`tenant "~g" shares the global hash tag`)
	}
}

func TestRateLimitUnknownScopePanics(t *testing.T) {
	for _, p := range []Per{"", "tenants", "TENANT"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RateLimit(%q) did not panic", p)
				}
			}()
			RateLimit(p, "r", Owner{Tenant: "t"})
		}()
	}
}

func TestPer(t *testing.T) {
	for _, p := range []Per{PerGlobal, PerTenant, PerTenantTool, PerSubject, PerSubjectTool} {
		if !p.Valid() {
			t.Errorf("%q not valid", p)
		}
		if got, want := p.TenantScoped(), p != PerGlobal; got != want {
			t.Errorf("%q.TenantScoped() = %v, want %v", p, got, want)
		}
	}
	for _, p := range []Per{"", "tool", "Global"} {
		if p.Valid() || p.TenantScoped() {
			t.Errorf("%q: Valid or TenantScoped", p)
		}
	}
}

func TestHashTag(t *testing.T) {
	// Rules of Redis Cluster's keyHashSlot.
	tests := []struct{ key, want string }{
		{"foo", "foo"},
		{"{user1000}.following", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"}, // empty tag: whole key
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
		{"{}", "{}"},
		{"{", "{"},
		{"}{a}", "a"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := HashTag(tt.key); got != tt.want {
			t.Errorf("HashTag(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

func TestSlot(t *testing.T) {
	// Values from redis-server 7.0 CLUSTER KEYSLOT.
	tests := []struct {
		key  string
		want uint16
	}{
		{"foo", 12182},
		{"bar", 5061},
		{"hello", 866},
		{"123456789", 12739},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363},
		{"foo{{bar}}zap", 4015},
		{"foo{bar}{zap}", 5061},
		{"{}", 15257},
		{"", 0},
		{"mcpgate:rl:{~}:tenant:r", 8025},
		{"mcpgate:rl:{a%7Db}:tenant:r", 13663},
	}
	for _, tt := range tests {
		if got := Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
	if crc16("123456789") != 0x31C3 { // CRC-16/XMODEM check value
		t.Errorf("crc16(123456789) = %#x, want 0x31c3", crc16("123456789"))
	}
}

// checkEscaped verifies the shape of one escaped component of in.
func checkEscaped(t *testing.T, in, e string) {
	t.Helper()
	if e == "" {
		t.Fatalf("Escape(%q) is empty", in)
	}
	if strings.ContainsAny(e, ":{}") {
		t.Fatalf("Escape(%q) = %q contains a separator or a brace", in, e)
	}
	if !utf8.ValidString(e) {
		t.Fatalf("Escape(%q) = %q is not valid UTF-8", in, e)
	}
	if strings.HasPrefix(e, "~h") {
		if len(e) != 34 || !strings.HasPrefix(Escape(in), "~h") {
			t.Fatalf("Escape(%q) = %q: bad digest form", in, e)
		}
		if len(in) < MaxComponent/3 {
			t.Fatalf("Escape(%q) = %q: a short input got a digest", in, e)
		}
		return
	}
	if len(e) > MaxComponent {
		t.Fatalf("Escape(%q) has %d bytes, more than MaxComponent", in, len(e))
	}
	back, ok := Unescape(e)
	if !ok || back != in {
		t.Fatalf("Escape(%q) = %q does not decode back (got %q, %v)", in, e, back, ok)
	}
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "a", "a:b", "a%3Ab", "~", "~g", "~h", "{", "}", "\xff\xfe", strings.Repeat("z", 97)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := Escape(s)
		checkEscaped(t, s, e)
		digest := strings.HasPrefix(e, "~h")
		if u, ok := Unescape(e); ok == digest || ok && u != s {
			t.Fatalf("Unescape(Escape(%q) = %q) = %q, %v", s, e, u, ok)
		}
		// Unescape accepts exactly the outputs of Escape.
		if u, ok := Unescape(s); ok && Escape(u) != s {
			t.Fatalf("Unescape(%q) = %q, but Escape(%q) = %q", s, u, u, Escape(u))
		}
	})
}

var scopes = []Per{PerGlobal, PerTenant, PerTenantTool, PerSubject, PerSubjectTool}

// relevant is what a key of scope p depends on: the fields p ignores are cleared.
func relevant(p Per, rule string, o Owner) [4]string {
	switch p {
	case PerGlobal:
		return [4]string{rule}
	case PerTenant:
		return [4]string{rule, o.Tenant}
	case PerTenantTool:
		return [4]string{rule, o.Tenant, "", o.Tool}
	case PerSubject:
		return [4]string{rule, o.Tenant, o.Subject}
	}
	return [4]string{rule, o.Tenant, o.Subject, o.Tool}
}

// checkKey verifies the layout of one key and returns its components after
// the scope.
func checkKey(t *testing.T, p Per, rule string, o Owner, key string) {
	t.Helper()
	const head = Prefix + "rl:{"
	if !strings.HasPrefix(key, head) {
		t.Fatalf("key %q does not start with %q", key, head)
	}
	tag := HashTag(key)
	wantTag := "~g"
	if p.TenantScoped() {
		wantTag = Escape(o.Tenant)
	}
	if tag != wantTag {
		t.Fatalf("HashTag(%q) = %q, want %q", key, tag, wantTag)
	}
	if Slot(key) != crc16(wantTag)&16383 {
		t.Fatalf("Slot(%q) is not the slot of its tag", key)
	}
	rest, ok := strings.CutPrefix(key, head+tag+"}:")
	if !ok {
		t.Fatalf("key %q: tag not followed by '}:'", key)
	}
	parts := strings.Split(rest, ":")
	want := []string{string(p), Escape(rule)}
	switch p {
	case PerTenantTool:
		want = append(want, Escape(o.Tool))
	case PerSubject:
		want = append(want, Escape(o.Subject))
	case PerSubjectTool:
		want = append(want, Escape(o.Subject), Escape(o.Tool))
	}
	if len(parts) != len(want) {
		t.Fatalf("key %q has %d components after the tag, want %d", key, len(parts), len(want))
	}
	for i := range want {
		if parts[i] != want[i] {
			t.Fatalf("key %q component %d = %q, want %q", key, i, parts[i], want[i])
		}
	}
	checkEscaped(t, rule, Escape(rule))
	checkEscaped(t, o.Tenant, Escape(o.Tenant))
	checkEscaped(t, o.Subject, Escape(o.Subject))
	checkEscaped(t, o.Tool, Escape(o.Tool))
}

func FuzzRateLimit(f *testing.F) {
	f.Add(uint8(1), "r", "a}b", "s", "t", uint8(1), "r", "a", "s", "t")
	f.Add(uint8(2), "r", "x:y", "", "t", uint8(2), "r", "x", "", "y:t")
	f.Add(uint8(1), "r", "a%3Ab", "", "", uint8(1), "r", "a:b", "", "")
	f.Add(uint8(3), "r:s", "t", "u", "", uint8(3), "r", "t", "s:u", "")
	f.Add(uint8(4), "", "", "", "", uint8(0), "", "", "", "")
	f.Add(uint8(1), "r", "~g", "", "", uint8(0), "r", "", "", "")
	f.Add(uint8(1), "r", "{", "}", "", uint8(1), "r", "}", "{", "")
	f.Add(uint8(4), "r", "\xff\xfe", "s", "t", uint8(4), "r", "\xff", "\xfes", "t")
	f.Add(uint8(1), "r", strings.Repeat("x", 10000), "", "", uint8(1), "r", strings.Repeat("x", 9999), "", "")
	f.Fuzz(func(t *testing.T, p1 uint8, rule1, tenant1, subject1, tool1 string,
		p2 uint8, rule2, tenant2, subject2, tool2 string) {
		per1, per2 := scopes[int(p1)%len(scopes)], scopes[int(p2)%len(scopes)]
		o1 := Owner{Tenant: tenant1, Subject: subject1, Tool: tool1}
		o2 := Owner{Tenant: tenant2, Subject: subject2, Tool: tool2}
		k1, k2 := RateLimit(per1, rule1, o1), RateLimit(per2, rule2, o2)
		checkKey(t, per1, rule1, o1, k1)
		checkKey(t, per2, rule2, o2, k2)
		same := per1 == per2 && relevant(per1, rule1, o1) == relevant(per2, rule2, o2)
		if same != (k1 == k2) {
			t.Fatalf("inputs (%s %q %+v) and (%s %q %+v): same inputs = %v but keys %q and %q",
				per1, rule1, o1, per2, rule2, o2, same, k1, k2)
		}
		// All of one tenant's counters share a slot; a tenant never shares
		// the global tag.
		if per1.TenantScoped() && per2.TenantScoped() && tenant1 == tenant2 && Slot(k1) != Slot(k2) {
			t.Fatalf("tenant %q: keys %q and %q in different slots", tenant1, k1, k2)
		}
		if per1.TenantScoped() != per2.TenantScoped() && HashTag(k1) == HashTag(k2) {
			t.Fatalf("a tenant key and a global key share a tag: %q, %q", k1, k2)
		}
		// A tenant's prefix covers exactly its tenant-scoped counters.
		if per2.TenantScoped() && strings.HasPrefix(k2, TenantCounters(tenant1)) != (tenant1 == tenant2) {
			t.Fatalf("TenantCounters(%q) = %q and key %q of tenant %q", tenant1, TenantCounters(tenant1), k2, tenant2)
		}
		if !per2.TenantScoped() && strings.HasPrefix(k2, TenantCounters(tenant1)) {
			t.Fatalf("TenantCounters(%q) = %q covers the global key %q", tenant1, TenantCounters(tenant1), k2)
		}
		// A rule's per-tool prefix for o1 covers exactly the counters of
		// that rule and owner, whatever their tool.
		if per1 == PerTenantTool || per1 == PerSubjectTool {
			prefix := ToolCounters(per1, "gcra", rule1, o1)
			k := Counter(per2, "gcra", rule2, o2)
			sameOwner := tenant1 == tenant2 && (per1 == PerTenantTool || subject1 == subject2)
			if want := per1 == per2 && rule1 == rule2 && sameOwner; strings.HasPrefix(k, prefix) != want {
				t.Fatalf("ToolCounters(%s, %q, %+v) = %q; key %q of (%s %q %+v): prefix %v, want %v",
					per1, rule1, o1, prefix, k, per2, rule2, o2, !want, want)
			}
			if tool, ok := ToolOf(Counter(per1, "gcra", rule1, o1)); ok != !strings.HasPrefix(Escape(tool1), "~h") || ok && tool != tool1 {
				t.Fatalf("ToolOf(key of tool %q) = %q, %v", tool1, tool, ok)
			}
		}
	})
}

func TestCounterSeparatesAlgorithms(t *testing.T) {
	o := Owner{Tenant: "acme"}
	tb := Counter(PerTenant, "token_bucket", "per_tenant", o)
	gc := Counter(PerTenant, "gcra", "per_tenant", o)
	if tb == gc {
		t.Fatalf("same key for two algorithms: %s", tb)
	}
	if want := "mcpgate:rl:{acme}:tenant:token_bucket.per_tenant"; tb != want {
		t.Fatalf("Counter = %q, want %q", tb, want)
	}
	// a rule name containing '.' stays apart from other algorithms' rules
	if Counter(PerTenant, "gcra", "x.y", o) == Counter(PerTenant, "fixed_window", "x.y", o) {
		t.Fatal("different algorithms share a key")
	}
	if HashTag(tb) != "acme" {
		t.Fatalf("hash tag of %s = %s", tb, HashTag(tb))
	}
}

func TestUsageKey(t *testing.T) {
	k := Usage("acme", "2026-11")
	if k != "mcpgate:usage:{acme}:2026-11" {
		t.Fatalf("Usage = %q", k)
	}
	if Slot(k) != Slot(RateLimit(PerTenant, "r", Owner{Tenant: "acme"})) {
		t.Fatal("usage meter is not in the tenant's slot")
	}
	if Usage("a}b", "2026-11") == Usage("a", "b}:2026-11") || HashTag(Usage("a}b", "p")) != Escape("a}b") {
		t.Fatal("hostile tenant breaks the usage key")
	}
}
