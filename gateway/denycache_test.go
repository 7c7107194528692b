package gateway

import (
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
