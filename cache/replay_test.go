package cache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// loadOld stores v in c under k (a miss), failing the test otherwise.
func loadOld(t *testing.T, c *Cache, k Key, v string, pol Policy) {
	t.Helper()
	var l loads
	if got, src := get(t, c, k, l.fixed(v, 0), pol); got != v || src != Miss {
		t.Fatalf("first Get: %q %v, want a miss storing %q", got, src, v)
	}
	if got, src := get(t, c, k, l.fixed("unused", 0), pol); got != v || src != Hit {
		t.Fatalf("second Get: %q %v, want a hit", got, src)
	}
}

// notServed fails the test if a Get of k returns the value "old", which an
// invalidation was meant to drop.
func notServed(t *testing.T, c *Cache, k Key, pol Policy, when string) (string, Source) {
	t.Helper()
	var l loads
	v, src := get(t, c, k, l.fixed("new", 0), pol)
	if v == "old" {
		t.Fatalf("%s: the entry an invalidation dropped is served (%v); stats %+v", when, src, c.Stats())
	}
	return v, src
}

// An invalidation that fails while Redis is frozen (a timeout), and one
// the breaker then skips, are not lost: the Cache stops using the store at
// once, and once Redis answers again the probe replays both before the
// store counts as available. Without that, the entries they were meant to
// drop came back as fresh hits after the outage (on every instance) until
// their TTL ended.
func TestInvalidationFailedDuringAnOutageIsReplayedOnRecovery(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	ctx := context.Background()
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond})
	sc := scope(t)
	k1 := mustKey(t, sc, "get", `{"id":1}`)
	k2 := mustKey(t, sc, "get", `{"id":2}`)
	pol1 := Policy{TTL: time.Hour, Tags: []string{"p:1"}}
	pol2 := Policy{TTL: time.Hour, Tags: []string{"p:2"}}
	loadOld(t, c, k1, "old", pol1)
	loadOld(t, c, k2, "old", pol2)

	thaw := r.Freeze(t)
	if _, err := c.Invalidate(ctx, sc, []string{"p:1"}); err == nil {
		t.Fatal("Invalidate on a frozen Redis succeeded")
	}
	if c.StoreAvailable() {
		t.Fatal("the store counts as available with a failed invalidation not replayed")
	}
	// The breaker is open: this one is skipped, and remembered too.
	if _, err := c.Invalidate(ctx, sc, []string{"p:2"}); !errors.Is(err, ErrStoreSkipped) {
		t.Fatalf("second Invalidate on a frozen Redis = %v, want ErrStoreSkipped", err)
	}
	if st := c.Stats(); st.FailedInvalidations != 2 || st.PendingInvalidations != 2 || st.ReplayedInvalidations != 0 {
		t.Fatalf("stats after two failed invalidations: %+v", st)
	}
	// Meanwhile Gets bypass the store.
	if e, _, err := c.Get(ctx, k1, func(context.Context) ([]byte, bool, error) { return []byte("upstream"), false, nil }, pol1); err != nil ||
		string(e.Value) != "upstream" || !errors.Is(e.StoreErr, ErrStoreSkipped) {
		t.Fatalf("Get during the outage: %q %v, StoreErr %v; want the loader's value, store skipped", e.Value, err, e.StoreErr)
	}

	thaw()
	testenv.Eventually(t, 15*time.Second, "the store to be available again", c.StoreAvailable)
	for _, k := range []struct {
		k   Key
		pol Policy
	}{{k1, pol1}, {k2, pol2}} {
		if v, src := notServed(t, c, k.k, k.pol, "after the outage"); v != "new" || src != Miss {
			t.Fatalf("Get after the outage: %q %v, want a miss", v, src)
		}
	}
	if st := c.Stats(); st.ReplayedInvalidations != 2 || st.PendingInvalidations != 0 || st.LostInvalidations != 0 {
		t.Fatalf("stats after the replay: %+v", st)
	}
}

// One invalidation that times out on a slow Redis (DEBUG SLEEP), the
// breaker still closed (it would take 100 failures to open it), is
// remembered too: the breaker is pushed open at once, so Gets bypass the
// cache instead of serving the entry the invalidation missed, and the
// probe replays the invalidation once Redis answers, before the store is
// used again.
func TestInvalidationTimingOutWithTheBreakerClosedIsReplayed(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--enable-debug-command", "yes"}})
	client := r.Client(t)
	ctx := context.Background()
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, BreakerFailures: 100})
	sc := scope(t)
	k := mustKey(t, sc, "get", `{"id":1}`)
	pol := Policy{TTL: time.Hour, Tags: []string{"p:1"}}
	loadOld(t, c, k, "old", pol)

	sleeper, prober := r.Client(t), r.Client(t)
	slept := make(chan error, 1)
	go func() {
		slept <- sleeper.Do(ctx, sleeper.B().Arbitrary("DEBUG", "SLEEP").Args("3").Build()).Error()
	}()
	testenv.Eventually(t, 15*time.Second, "DEBUG SLEEP to stall the server", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		return prober.Do(pctx, prober.B().Ping().Build()).Error() != nil
	})
	if _, err := c.Invalidate(ctx, sc, []string{"p:1"}); err == nil {
		t.Fatal("Invalidate on a sleeping Redis succeeded")
	}
	if c.StoreAvailable() {
		t.Fatal("one timed-out invalidation left the store available: Gets would serve the entry it missed")
	}
	// Until the replay, each Get bypasses the store (or, once replayed,
	// misses): none serves the entry.
	for end := time.Now().Add(15 * time.Second); !c.StoreAvailable(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for the replay: %+v", c.Stats())
		}
		notServed(t, c, k, pol, "before the replay")
	}
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	if v, src := notServed(t, c, k, pol, "after the replay"); v != "new" || src != Miss {
		t.Fatalf("Get after the replay: %q %v, want a miss", v, src)
	}
	if st := c.Stats(); st.FailedInvalidations != 1 || st.ReplayedInvalidations != 1 || st.PendingInvalidations != 0 {
		t.Fatalf("stats after the replay: %+v", st)
	}
}

// Past Options.MaxPendingInvalidations a failed invalidation is not
// remembered; the store then stays unavailable until every entry it may
// have missed has expired (the longest life an entry of the Cache can
// get), so the entry is never served again, though it cannot be replayed.
func TestInvalidationsOverTheBoundKeepTheStoreUnavailable(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	ctx := context.Background()
	c := newCache(t, mustRedisStore(t, client), &Options{
		Timeout: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, MaxPendingInvalidations: 1,
		// The lost invalidation keeps the store unavailable for about
		// TTL + LoadTimeout (LockTTL) + Timeout: a few seconds.
		LockTTL: 300 * time.Millisecond, StaleWindow: -1,
	})
	sc := scope(t)
	k := mustKey(t, sc, "get", `{"id":1}`)
	pol := Policy{TTL: 2 * time.Second, Tags: []string{"p:1"}}
	loadOld(t, c, k, "old", pol)

	thaw := r.Freeze(t)
	if _, err := c.Invalidate(ctx, sc, []string{"other"}); err == nil {
		t.Fatal("Invalidate on a frozen Redis succeeded")
	}
	if _, err := c.Invalidate(ctx, sc, []string{"p:1"}); err == nil {
		t.Fatal("Invalidate on a frozen Redis succeeded")
	}
	if st := c.Stats(); st.FailedInvalidations != 2 || st.PendingInvalidations != 1 || st.LostInvalidations != 1 {
		t.Fatalf("stats after two failed invalidations, bound 1: %+v", st)
	}
	thaw()
	testenv.Eventually(t, 15*time.Second, "the remembered invalidation to be replayed", func() bool {
		return c.Stats().ReplayedInvalidations == 1
	})
	for !c.StoreAvailable() {
		notServed(t, c, k, pol, "before the lost invalidation's period ended")
		time.Sleep(20 * time.Millisecond)
	}
	if v, src := notServed(t, c, k, pol, "after the lost invalidation's period"); v != "new" || src != Miss {
		t.Fatalf("Get once the store is available: %q %v, want a miss", v, src)
	}
}

// A tag that fails again while its earlier failure is being replayed stays
// remembered: the replay may have run before the later mutation.
func TestPendingInvalidationFailingAgainDuringReplayStays(t *testing.T) {
	p := newPendingInvalidations(10)
	sc := Tenant("t")
	now := time.Now()
	p.add(sc, []string{"a", "b"}, time.Minute, now)
	bs := p.batches()
	if len(bs) != 1 || len(bs[0].tags) != 2 {
		t.Fatalf("batches %+v", bs)
	}
	p.add(sc, []string{"a"}, time.Minute, now)
	p.done(bs[0])
	if n := p.pending(); n != 1 || p.settle(now) == nil || !p.dirty.Load() {
		t.Fatalf("after a replay that raced a new failure of a: %d pending, dirty %v", n, p.dirty.Load())
	}
	p.done(p.batches()[0])
	if err := p.settle(now); err != nil || p.dirty.Load() || p.replayed.Load() != 2 || p.failed.Load() != 3 {
		t.Fatalf("settle %v, dirty %v, replayed %d, failed %d", err, p.dirty.Load(), p.replayed.Load(), p.failed.Load())
	}
}
