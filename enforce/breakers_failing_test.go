package enforce

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func sessionBreaker(tenant, id string) *limit.BreakerSpec {
	return &limit.BreakerSpec{Key: "mcpgate:br:{" + tenant + "}:" + id, Tenant: tenant, ID: id,
		ConsecutiveDenials: 3, ConsecutiveFailures: 3, Cooldown: 30 * time.Second, MaxCooldown: 10 * time.Minute}
}

// The breaker cache's record of failing breakers (failing) was never
// pruned by time, and cleared everyone's when full: one tenant whose
// breakers are keyed by session (breaker.key: session) leaves one entry
// per session whose last call failed, and at breakerCacheSize of them
// another tenant's record was gone: that tenant's success racing its own
// failure (the case the record exists for) then went unreported, and
// fail, succeed, fail opened its breaker. A tenant's entries past its
// share evict its own oldest; a full record drops its oldest entries
// only; an entry lapses once the store may have dropped the count
// (MaxCooldown past its last change).
func TestBreakerFailingClearedByOtherTenant(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	c := newBreakerCache(clock.now, func(limit.BreakerSpec, limit.BreakerState) {})
	failed := limit.BreakerState{Failures: 1}
	victim := sessionBreaker("globex", "subject:bob")
	c.observe(victim, failed)
	for i := range breakerCacheSize {
		c.observe(sessionBreaker("acme", fmt.Sprintf("session:s%d", i)), failed)
	}
	if !c.hasFailures(victim.Key) {
		t.Fatalf("globex's failing breaker forgotten after acme's %d session breakers failed once each (failing holds %d)",
			breakerCacheSize, c.nFailing.Load())
	}
	if n := c.nFailing.Load(); n != breakerTenantShare+1 {
		t.Fatalf("failing holds %d, want acme's share %d and globex's 1", n, breakerTenantShare)
	}
	if c.hasFailures(sessionBreaker("acme", "session:s0").Key) || !c.hasFailures(sessionBreaker("acme", fmt.Sprintf("session:s%d", breakerCacheSize-1)).Key) {
		t.Fatal("past its share, acme's entries did not evict its own oldest")
	}

	// Ten tenants fill the record: it drops its oldest entries, not all.
	c = newBreakerCache(clock.now, func(limit.BreakerSpec, limit.BreakerState) {})
	for i := range breakerCacheSize - 1 {
		c.observe(sessionBreaker(fmt.Sprintf("t%d", i/breakerTenantShare), fmt.Sprintf("session:s%d", i)), failed)
	}
	c.observe(victim, failed) // the record is full
	for i := range 1000 {
		c.observe(sessionBreaker("initech", fmt.Sprintf("session:s%d", i)), failed)
	}
	if !c.hasFailures(victim.Key) {
		t.Fatalf("globex's failing breaker forgotten after %d others failed (failing holds %d)", 1000, c.nFailing.Load())
	}
	if n := c.nFailing.Load(); n != breakerCacheSize {
		t.Fatalf("failing holds %d, want %d (full)", n, breakerCacheSize)
	}
	if c.hasFailures(sessionBreaker("t0", "session:s999").Key) || !c.hasFailures(sessionBreaker("t0", "session:s1000").Key) {
		t.Fatal("full, failing did not drop exactly its oldest entries")
	}

	// Past MaxCooldown the store has dropped those counts: their entries
	// lapse, and a new one takes their room.
	clock.add(10 * time.Minute)
	c.observe(victim, failed)
	clock.add(time.Minute)
	if c.hasFailures(sessionBreaker("initech", "session:s999").Key) {
		t.Fatal("an entry older than MaxCooldown still counts")
	}
	c.observe(sessionBreaker("initech", "session:u0"), failed)
	if n := c.nFailing.Load(); n != 2 {
		t.Fatalf("failing holds %d entries, want 2 (the lapsed ones dropped)", n)
	}
	if !c.hasFailures(victim.Key) {
		t.Fatal("globex's failing breaker forgotten")
	}
	c.observe(victim, limit.BreakerState{}) // its count reset
	if c.hasFailures(victim.Key) {
		t.Fatal("a breaker whose count was reset still counts as failing")
	}
}

// addDenials is a store that answers AddDenials with a count of denials
// below the threshold, and counts the calls.
type addDenials struct {
	limit.GuardedStore
	mu sync.Mutex
	n  int
}

func (s *addDenials) AddDenials(context.Context, limit.BreakerSpec, int64) (limit.BreakerState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return limit.BreakerState{Denials: 1}, nil
}

// The record of denial counts (denials) cleared everyone's when full,
// too: another tenant's breakers filling it made a breaker whose count had
// reached the threshold (half-open: its denials are not sent for
// BreakerCacheHold) send each denial again. A tenant's entries past its
// share evict its own oldest; an entry lapses after BreakerCacheHold, when
// it no longer spares a round trip.
func TestBreakerDenialsClearedByOtherTenant(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	c := newBreakerCache(clock.now, func(limit.BreakerSpec, limit.BreakerState) {})
	victim := sessionBreaker("globex", "subject:bob")
	c.observe(victim, limit.BreakerState{Denials: 3, HalfOpen: true}) // at the threshold
	for i := range breakerCacheSize {
		c.observe(sessionBreaker("acme", fmt.Sprintf("session:s%d", i)), limit.BreakerState{Denials: 1})
	}
	store := &addDenials{}
	c.deniedLocally(context.Background(), store, victim)
	if store.n != 0 {
		t.Fatalf("globex's denial sent to the store (%d calls): its count at the threshold was forgotten after acme's breakers filled the record", store.n)
	}
	clock.add(BreakerCacheHold)
	c.deniedLocally(context.Background(), store, victim)
	if store.n != 1 {
		t.Fatalf("%d calls to the store, want 1: a count seen BreakerCacheHold ago spares no round trip", store.n)
	}
}
