package enforce

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// An insertion into a breaker cache full of live entries (breakerCacheSize
// breakers open for a 10m cooldown: tenants' session-keyed breakers, say)
// drops one entry, its oldest, and visits no other; the entries left still
// answer past their hold while the store is down, and not while it is up.
// (Once, since an open breaker's entry lives until its cooldown ends, each
// such insertion swept the whole map, 100k entries, under the cache's one
// lock, which every breaker-guarded call takes.)
func TestBreakerCacheFullDropsOldestOnInsert(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	c := newBreakerCache(clock.now, func(limit.BreakerSpec, limit.BreakerState) {})
	open := limit.BreakerState{Open: true, RetryAfter: 10 * time.Minute, Cooldown: 10 * time.Minute}
	spec := func(tenant string, i int) *limit.BreakerSpec {
		return &limit.BreakerSpec{Key: fmt.Sprintf("b:%s:%d", tenant, i), Tenant: tenant, Cooldown: 10 * time.Minute, MaxCooldown: 10 * time.Minute}
	}
	const tenants = breakerCacheSize / breakerTenantShare // each at its share: full
	for i := range breakerCacheSize {
		c.observe(spec(fmt.Sprint("flood", i%tenants), i/tenants), open)
	}
	if c.open.len() != breakerCacheSize || c.open.dropped != 0 {
		t.Fatalf("filled with %d breakers: %d held, %d dropped", breakerCacheSize, c.open.len(), c.open.dropped)
	}
	clock.add(2 * BreakerCacheHold) // past every hold, well within every cooldown

	const n = 300
	for i := range n {
		c.observe(spec("other", i), open)
	}
	if c.open.dropped != n || c.open.len() != breakerCacheSize {
		t.Fatalf("%d breakers seen open with the cache full of live entries: %d dropped, %d held; want one dropped each (the oldest), %d held",
			n, c.open.dropped, c.open.len(), breakerCacheSize)
	}
	for i := range n {
		if _, ok := c.stillOpen(spec("other", i).Key); !ok {
			t.Fatalf("breaker %d seen open last is not held", i)
		}
	}
	if _, ok := c.stillOpen(spec("flood0", 0).Key); ok {
		t.Fatal("the oldest breaker is still held: nothing made room")
	}
	newest := spec(fmt.Sprint("flood", tenants-1), breakerTenantShare-1).Key
	if _, ok := c.stillOpen(newest); !ok {
		t.Fatal("a breaker within its cooldown, past its hold, is not answered while the store is down")
	}
	if _, ok := c.lookup(newest, true); ok {
		t.Fatal("a breaker past its hold is answered in process while the store is up")
	}
}
