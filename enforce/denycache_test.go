package enforce

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// The denial cache evicts the least recently used entry and never holds an
// admission.
func TestDenialCacheLRU(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := newDenialCache(3, func() time.Time { return now })
	rule := limit.Rule{Name: "r", Algorithm: limit.FixedWindow, Limit: 5, Period: time.Minute}
	checks := func(key string) []limit.Check { return []limit.Check{{Rule: rule, Key: key}} }
	denied := limit.Decision{Rule: rule, Limit: 5, RetryAfter: time.Hour, ResetAfter: time.Hour, Results: []limit.Result{{RetryAfter: time.Hour}}}
	for _, k := range []string{"a", "b", "c"} {
		c.remember(checks(k), 1, denied)
	}
	if _, ok := c.lookup(checks("a"), 1); !ok { // a becomes the most recent
		t.Fatal("a not cached")
	}
	c.remember(checks("d"), 1, denied) // evicts b, the least recently used
	for k, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
		if _, ok := c.lookup(checks(k), 1); ok != want {
			t.Errorf("%s cached = %v, want %v", k, ok, want)
		}
	}
	if n := c.len(); n != 3 {
		t.Fatalf("len = %d, want 3", n)
	}
	admitted := limit.Decision{Allowed: true, Rule: rule, Results: []limit.Result{{Allowed: true}}}
	c.remember(checks("e"), 1, admitted)
	if _, ok := c.lookup(checks("e"), 1); ok || c.len() != 3 {
		t.Fatal("an admission was cached")
	}
}

// The denial cache in isolation: it denies only what the store denied, for
// at least the cost denied, until the retry time; it never holds concurrency
// or shadow denials, and stays bounded.
func TestDenialCacheUnit(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	c := newDenialCache(3, clock)
	rule := limit.Rule{Name: "r", Algorithm: limit.FixedWindow, Limit: 5, Period: time.Minute}
	check := func(key string, r limit.Rule) []limit.Check { return []limit.Check{{Rule: r, Key: key}} }
	deny := func(r limit.Rule, retry time.Duration) limit.Decision {
		return limit.Decision{Rule: r, Limit: r.Limit, RetryAfter: retry, ResetAfter: retry, Results: []limit.Result{{RetryAfter: retry}}}
	}

	c.remember(check("k1", rule), 2, deny(rule, 800*time.Millisecond))
	if _, ok := c.lookup(check("k1", rule), 1); ok {
		t.Fatal("a denial of cost 2 denied a cost-1 request (it might fit)")
	}
	d, ok := c.lookup(check("k1", rule), 3)
	if !ok || d.Rule.Name != "r" {
		t.Fatal("a denial of cost 2 did not cover a cost-3 request")
	}
	now = now.Add(300 * time.Millisecond)
	if d, ok = c.lookup(check("k1", rule), 2); !ok || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("after 300ms: %v %v, want a retry in 500ms", d.RetryAfter, ok)
	}
	if _, ok := c.lookup(check("k2", rule), 9); ok {
		t.Fatal("another key denied")
	}
	now = now.Add(500 * time.Millisecond)
	if _, ok := c.lookup(check("k1", rule), 2); ok {
		t.Fatal("denied at the retry time")
	}

	conc := limit.Rule{Name: "c", Algorithm: limit.Concurrency, Limit: 1, Period: time.Minute}
	c.remember(check("kc", conc), 1, deny(conc, time.Second))
	if _, ok := c.lookup(check("kc", conc), 1); ok {
		t.Fatal("a concurrency denial was cached (its slots free at any moment)")
	}
	shadow := rule
	shadow.Shadow = true
	c.remember(check("ks", shadow), 1, deny(shadow, time.Minute))
	if _, ok := c.lookup(check("ks", shadow), 1); ok {
		t.Fatal("a shadow denial was cached")
	}
	c.remember(check("kn", rule), 9, deny(rule, limit.Never))
	if d, ok := c.lookup(check("kn", rule), 9); !ok || d.RetryAfter != limit.Never {
		t.Fatal("a never-fits denial was not cached as never")
	}
	c.forget()

	for i := range 10 {
		c.remember(check(fmt.Sprint("many", i), rule), 1, deny(rule, time.Hour))
	}
	c.mu.Lock()
	n := len(c.m)
	c.mu.Unlock()
	if n > 3 {
		t.Fatalf("cache holds %d entries, bound 3", n)
	}
	c.forget()
	if _, ok := c.lookup(check("many9", rule), 1); ok {
		t.Fatal("forget kept an entry")
	}
}

// A denial whose retry time is far off (or never) is answered in process
// for DenialCacheHold only; then the store is asked again, so that a reset
// or a refund made on another instance reaches this one. Within the hold
// the retry time served counts down from the store's.
func TestDenialCacheHold(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	c := newDenialCache(10, func() time.Time { return now })
	rule := limit.Rule{Name: "daily", Algorithm: limit.FixedWindow, Limit: 5, Period: 24 * time.Hour}
	for _, retry := range []time.Duration{time.Hour, limit.Never} {
		checks := []limit.Check{{Rule: rule, Key: fmt.Sprint("k", retry)}}
		c.remember(checks, 1, limit.Decision{Rule: rule, Limit: 5, RetryAfter: retry, ResetAfter: time.Hour, Results: []limit.Result{{RetryAfter: retry}}})
		start := now
		now = start.Add(DenialCacheHold - time.Millisecond)
		d, ok := c.lookup(checks, 1)
		want := retry
		if retry != limit.Never {
			want = retry - (DenialCacheHold - time.Millisecond)
		}
		if !ok || d.RetryAfter != want {
			t.Fatalf("retry %v, just inside the hold: %v %v, want a denial retrying in %v", retry, d.RetryAfter, ok, want)
		}
		now = start.Add(DenialCacheHold)
		if _, ok := c.lookup(checks, 1); ok {
			t.Fatalf("retry %v: still answered in process after DenialCacheHold", retry)
		}
	}
	if n := c.len(); n != 0 {
		t.Fatalf("%d entries left after their hold", n)
	}
}

// A cached denial serves only checks of the rule that denied. A tier rule
// and a tool rule may share a name (with different scopes): the tool
// rule's long denial must not be cached under the tier rule's key. Tiers
// whose rules share a name and algorithm share a counter key: a denial
// under one tier's limit must not deny under another's.
func TestDenialCacheMatchesTheRule(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := newDenialCache(10, func() time.Time { return now })
	tier := limit.Rule{Name: "cap", Algorithm: limit.FixedWindow, Limit: 1, Period: time.Second}
	tool := limit.Rule{Name: "cap", Algorithm: limit.FixedWindow, Limit: 1, Period: time.Hour}
	both := []limit.Check{{Rule: tier, Key: "tenant"}, {Rule: tool, Key: "tenant-tool"}}
	// Both deny; the tool rule decides (the longer retry).
	c.remember(both, 1, limit.Decision{Rule: tool, Limit: 1, RetryAfter: time.Hour, ResetAfter: time.Hour,
		Results: []limit.Result{{RetryAfter: time.Second}, {RetryAfter: time.Hour}}})
	if d, ok := c.lookup(both[:1], 1); ok {
		t.Errorf("another tool (the tier rule only) denied from the cache: %+v", d)
	}
	if _, ok := c.lookup(both, 1); !ok {
		t.Error("the tool's own call not denied from the cache")
	}

	free := limit.Rule{Name: "per_tenant", Algorithm: limit.FixedWindow, Limit: 1, Period: time.Hour}
	pro := free
	pro.Limit = 100
	c.remember([]limit.Check{{Rule: free, Key: "acme"}}, 1, limit.Decision{Rule: free, Limit: 1, RetryAfter: time.Hour,
		ResetAfter: time.Hour, Results: []limit.Result{{RetryAfter: time.Hour}}})
	if _, ok := c.lookup([]limit.Check{{Rule: pro, Key: "acme"}}, 1); ok {
		t.Error("a denial under the free tier's limit denied the tenant under the pro tier's")
	}
	if _, ok := c.lookup([]limit.Check{{Rule: free, Key: "acme"}}, 1); !ok {
		t.Error("the free tier's own denial is not cached")
	}
}
