package keyspace

import (
	"strings"
	"testing"
)

func TestCacheEntryLayout(t *testing.T) {
	h := strings.Repeat("ab", 32)
	e := CacheEntry(TenantCache("acme"), "search", h)
	if want := "mcpgate:cache:{acme:search:" + h + "}"; e != want {
		t.Fatalf("CacheEntry = %q, want %q", e, want)
	}
	if got := CacheEntry(SharedCache(), "search", h); got != "mcpgate:cache:{~shared:search:"+h+"}" {
		t.Fatalf("shared CacheEntry = %q", got)
	}
	if got := CacheTag(TenantCache("acme"), "product:42"); got != "mcpgate:ctag:{acme:product%3A42}" {
		t.Fatalf("CacheTag = %q", got)
	}
	if tk := CacheTag(TenantCache("acme"), "t"); Slot(CacheTagDrain(tk)) != Slot(tk) || CacheTagDrain(tk) == tk {
		t.Errorf("CacheTagDrain(%q) = %q: not another key in the index's slot", tk, CacheTagDrain(tk))
	}
	for _, k := range []string{CacheLock(e), CacheFence(e), CacheChannel(e)} {
		if Slot(k) != Slot(e) || HashTag(k) != HashTag(e) {
			t.Errorf("%q is not in the slot of its entry %q", k, e)
		}
		if !strings.HasPrefix(k, e+":") {
			t.Errorf("%q does not extend its entry key", k)
		}
	}
	if !strings.HasPrefix(e, strings.TrimSuffix(CachePattern, "*")) {
		t.Errorf("CachePattern %q does not match %q", CachePattern, e)
	}
}

func TestCacheScope(t *testing.T) {
	if s := TenantCache("acme"); s.Shared() || s.Tenant() != "acme" || s.String() != "acme" {
		t.Fatalf("TenantCache(acme) = %+v %q", s, s.String())
	}
	if s := SharedCache(); !s.Shared() || s.Tenant() != "" || s.String() != "~shared" {
		t.Fatalf("SharedCache() = %+v %q", s, s.String())
	}
	if (CacheScope{}) != TenantCache("") {
		t.Fatal("zero CacheScope is not the tenant \"\"")
	}
	// No tenant name reaches the shared scope, whatever it is called.
	for _, tenant := range []string{"~shared", "%7Eshared", "", "~", "shared"} {
		if TenantCache(tenant).String() == SharedCache().String() {
			t.Errorf("tenant %q has the shared scope's key component", tenant)
		}
		if CacheEntry(TenantCache(tenant), "t", "h") == CacheEntry(SharedCache(), "t", "h") ||
			CacheTag(TenantCache(tenant), "x") == CacheTag(SharedCache(), "x") {
			t.Errorf("tenant %q shares a cache key with the shared scope", tenant)
		}
	}
}

// TestCacheEntryHostile checks that separators and braces in any component
// neither merge two entries nor escape the hash tag.
func TestCacheEntryHostile(t *testing.T) {
	pairs := [][2][3]string{
		{{"a:b", "c", "h"}, {"a", "b:c", "h"}},
		{{"a}b", "c", "h"}, {"a", "}b:c", "h"}},
		{{"a", "b", "c:d"}, {"a", "b:c", "d"}},
		{{"{x}", "t", "h"}, {"x", "t", "h"}},
		{{"", "t", "h"}, {"~", "t", "h"}},
	}
	for _, p := range pairs {
		k1 := CacheEntry(TenantCache(p[0][0]), p[0][1], p[0][2])
		k2 := CacheEntry(TenantCache(p[1][0]), p[1][1], p[1][2])
		if k1 == k2 {
			t.Errorf("%q and %q give the same key %q", p[0], p[1], k1)
		}
		for _, k := range []string{k1, k2} {
			if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || !strings.HasSuffix(k, "}") {
				t.Errorf("key %q has a forged hash tag", k)
			}
		}
	}
}

func FuzzCacheEntry(f *testing.F) {
	f.Add("acme", false, "search", "h1", "acme", true, "search", "h1")
	f.Add("a:b", false, "c", "h", "a", false, "b:c", "h")
	f.Add("~shared", false, "t", "h", "", true, "t", "h")
	f.Add("a}b", false, "{", "}", "a", false, "}b", "{")
	f.Add(strings.Repeat("x", 200), false, "t", "h", strings.Repeat("x", 199), false, "t", "h")
	f.Fuzz(func(t *testing.T, tenant1 string, shared1 bool, tool1, hash1, tenant2 string, shared2 bool, tool2, hash2 string) {
		s1, s2 := TenantCache(tenant1), TenantCache(tenant2)
		if shared1 {
			s1 = SharedCache()
		}
		if shared2 {
			s2 = SharedCache()
		}
		k1, k2 := CacheEntry(s1, tool1, hash1), CacheEntry(s2, tool2, hash2)
		same := s1 == s2 && tool1 == tool2 && hash1 == hash2
		if same != (k1 == k2) {
			t.Fatalf("(%+v %q %q) and (%+v %q %q): same inputs = %v, keys %q and %q",
				s1, tool1, hash1, s2, tool2, hash2, same, k1, k2)
		}
		// The whole key past the prefix is the hash tag: the entry's lock,
		// fence and channel are in its slot, and nothing else is.
		if HashTag(k1) != strings.TrimSuffix(strings.TrimPrefix(k1, Prefix+"cache:{"), "}") {
			t.Fatalf("hash tag of %q is %q", k1, HashTag(k1))
		}
		if Slot(CacheLock(k1)) != Slot(k1) || Slot(CacheFence(k1)) != Slot(k1) || Slot(CacheChannel(k1)) != Slot(k1) {
			t.Fatalf("lock, fence or channel of %q outside its slot", k1)
		}
		t1, t2 := CacheTag(s1, tool1), CacheTag(s2, tool2)
		if (s1 == s2 && tool1 == tool2) != (t1 == t2) {
			t.Fatalf("tags (%+v %q) and (%+v %q): keys %q and %q", s1, tool1, s2, tool2, t1, t2)
		}
	})
}
