package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// result is a Get's outcome, sent from a goroutine (t.Fatal must run on
// the test's goroutine).
type result struct {
	v   string
	src Source
	err error
	at  time.Time
}

func goGet(ctx context.Context, c *Cache, k Key, load Loader, pol Policy) <-chan result {
	ch := make(chan result, 1)
	go func() {
		e, src, err := c.Get(ctx, k, load, pol)
		ch <- result{string(e.Value), src, err, time.Now()}
	}()
	return ch
}

// gated returns a loader that signals started, then waits for finish and
// returns v.
func gated(v string, started, finish chan struct{}) Loader {
	return func(context.Context) ([]byte, bool, error) {
		close(started)
		<-finish
		return []byte(v), false, nil
	}
}

// gatedErr is gated for a loader that fails with err.
func gatedErr(err error, started, finish chan struct{}) Loader {
	return func(context.Context) ([]byte, bool, error) {
		close(started)
		<-finish
		return nil, false, err
	}
}

// gate returns the channels of a gated loader and release, which closes
// finish once. release also runs when the test ends: before the caches'
// Close (which waits for the gated load) when the caches were made first.
func gate(t *testing.T) (started, finish chan struct{}, release func()) {
	started, finish = make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(finish) }) }
	t.Cleanup(release)
	return started, finish, release
}

func testFencing(t *testing.T, e storeEnv) {
	a := newCache(t, e.store(t), &Options{LockTTL: 100 * time.Millisecond, LoadTimeout: 5 * time.Second})
	b := newCache(t, e.store(t), nil)
	k := mustKey(t, scope(t), "search", `{}`)
	started, finish := make(chan struct{}), make(chan struct{})
	slow := goGet(context.Background(), a, k, gated("old", started, finish), minute)
	<-started
	time.Sleep(150 * time.Millisecond) // a's lock expires while a still loads
	var l loads
	if v, src := get(t, b, k, l.fixed("new", 0), minute); v != "new" || src != Miss {
		t.Fatalf("b after a's lock expired: %q %v, want its own load", v, src)
	}
	close(finish)
	if r := <-slow; r.err != nil || r.v != "old" {
		t.Fatalf("a's caller: %+v", r)
	}
	if got := a.Stats().Rejected; got != 1 {
		t.Fatalf("a.Rejected = %d, want 1: the late loader's commit was not refused", got)
	}
	for _, c := range []*Cache{a, b} {
		if v, src := get(t, c, k, l.fixed("x", 0), minute); v != "new" || src != Hit {
			t.Fatalf("after the late commit: %q %v, want the newer value", v, src)
		}
	}
}

func testXFetch(t *testing.T, e storeEnv) {
	// Beta 2: with reads every ~2ms and a 60ms load, a refresh starts
	// with near certainty while more than a load's time is left.
	c := newCache(t, e.store(t), &Options{Beta: 2})
	k := mustKey(t, scope(t), "search", `{}`)
	pol := Policy{TTL: 600 * time.Millisecond}
	var l loads
	load := l.fixed("v", 60*time.Millisecond)
	counts := map[Source]int{}
	total := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); total++ {
		_, src := get(t, c, k, load, pol)
		counts[src]++
		time.Sleep(2 * time.Millisecond)
	}
	if err := c.Close(); err != nil { // waits for a refresh in flight
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("%d Gets: %v; stats %+v", total, counts, st)
	if counts[Miss] != 1 || counts[Hit] != total-1 {
		t.Fatalf("sources %v: want one miss (the first Get) and hits only: the entry expired under steady load", counts)
	}
	// 2s of a 600ms TTL: at least 3 refreshes happened before expiry,
	// and far fewer than one per read.
	if st.Refreshes < 3 || l.count() != st.Refreshes+1 || st.Refreshes > int64(total/10) {
		t.Fatalf("%d refreshes, %d loads for %d reads; want >= 3 early refreshes, one load each", st.Refreshes, l.count(), total)
	}
}

func testStaleOnWaitTimeout(t *testing.T, e storeEnv) {
	a := newCache(t, e.store(t), nil)
	b := newCache(t, e.store(t), &Options{WaitTimeout: 150 * time.Millisecond})
	k := mustKey(t, scope(t), "search", `{}`)
	pol := Policy{TTL: 100 * time.Millisecond}
	var l loads
	get(t, a, k, l.fixed("old", 0), pol)
	time.Sleep(150 * time.Millisecond) // expired; the stale copy stays
	started, finish := make(chan struct{}), make(chan struct{})
	slow := goGet(context.Background(), a, k, gated("new", started, finish), pol)
	<-started
	t0 := time.Now()
	var lb loads
	v, src := get(t, b, k, lb.fixed("b's own", 0), pol)
	if v != "old" || src != Stale || lb.count() != 0 {
		t.Fatalf("waiter timing out: %q %v, %d loads; want the stale copy without loading", v, src, lb.count())
	}
	if d := time.Since(t0); d < 150*time.Millisecond || d > 2*time.Second {
		t.Fatalf("waited %v, want about WaitTimeout (150ms)", d)
	}
	close(finish)
	if r := <-slow; r.v != "new" || r.src != Miss {
		t.Fatalf("loader's caller: %+v", r)
	}
	if v, src := get(t, b, k, lb.fixed("x", 0), pol); v != "new" || src != Hit {
		t.Fatalf("after the load: %q %v", v, src)
	}
}

func testLoadOnWaitTimeout(t *testing.T, e storeEnv) {
	a := newCache(t, e.store(t), nil)
	b := newCache(t, e.store(t), &Options{WaitTimeout: 150 * time.Millisecond})
	k := mustKey(t, scope(t), "search", `{}`)
	started, finish := make(chan struct{}), make(chan struct{})
	slow := goGet(context.Background(), a, k, gated("a's", started, finish), minute)
	<-started
	var lb loads
	if v, src := get(t, b, k, lb.fixed("b's", 0), minute); v != "b's" || src != Miss || lb.count() != 1 {
		t.Fatalf("waiter timing out without a stale copy: %q %v, want its own load", v, src)
	}
	if st := b.Stats(); st.Uncached != 1 {
		t.Fatalf("b.Uncached = %d, want 1", st.Uncached)
	}
	close(finish)
	<-slow
	// b's result was not stored over the lock holder's.
	if v, src := get(t, b, k, lb.fixed("x", 0), minute); v != "a's" || src != Hit {
		t.Fatalf("after both loads: %q %v, want the lock holder's value", v, src)
	}
}

// testWakeUpNotPoll shows a waiter woken by the value landing: with polling
// and the lock's expiry both 10s away, only a wake-up returns it at once.
func testWakeUpNotPoll(t *testing.T, e storeEnv) {
	a := newCache(t, e.store(t), nil)
	b := newCache(t, e.store(t), &Options{PollInterval: 10 * time.Second, WaitTimeout: 10 * time.Second})
	k := mustKey(t, scope(t), "search", `{}`)
	started, finish := make(chan struct{}), make(chan struct{})
	slow := goGet(context.Background(), a, k, gated("v", started, finish), minute)
	<-started
	var lb loads
	waiter := goGet(context.Background(), b, k, lb.fixed("b's", 0), minute)
	time.Sleep(200 * time.Millisecond) // b is waiting
	released := time.Now()
	close(finish)
	r := <-waiter
	if r.err != nil || r.v != "v" || r.src != Coalesced || lb.count() != 0 {
		t.Fatalf("waiter: %+v, %d loads; want the lock holder's value", r, lb.count())
	}
	if d := r.at.Sub(released); d > time.Second {
		t.Fatalf("waiter returned %v after the value landed: not woken", d)
	}
	<-slow
}

func testReleaseWakesWaiter(t *testing.T, e storeEnv) {
	a := newCache(t, e.store(t), nil)
	b := newCache(t, e.store(t), &Options{PollInterval: 10 * time.Second, WaitTimeout: 10 * time.Second})
	k := mustKey(t, scope(t), "search", `{}`)
	started, finish := make(chan struct{}), make(chan struct{})
	errUpstream := errors.New("upstream timeout")
	failing := goGet(context.Background(), a, k, gatedErr(errUpstream, started, finish), minute)
	<-started
	var lb loads
	waiter := goGet(context.Background(), b, k, lb.fixed("b's", 0), minute)
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	close(finish)
	if r := <-failing; !errors.Is(r.err, errUpstream) {
		t.Fatalf("failing loader's caller: %+v", r)
	}
	r := <-waiter
	if r.err != nil || r.v != "b's" || r.src != Miss || lb.count() != 1 {
		t.Fatalf("waiter after the holder failed: %+v; want it to take the lock and load", r)
	}
	if d := r.at.Sub(released); d > time.Second {
		t.Fatalf("waiter loaded %v after the lock was released: not woken", d)
	}
}

func testWarm(t *testing.T, e storeEnv) {
	a := newCache(t, e.store(t), nil)
	b := newCache(t, e.store(t), nil)
	ctx := context.Background()
	sc := scope(t)
	var l loads
	const n = 100 // more than one batch
	items := make([]WarmItem, n)
	for i := range items {
		items[i] = WarmItem{Key: mustKey(t, sc, "search", fmt.Sprintf(`{"q":%d}`, i)), Policy: minute,
			Load: l.fixed(fmt.Sprint(i), 20*time.Millisecond)}
	}
	// Two instances warming together load each entry once.
	var wg sync.WaitGroup
	var ra, rb WarmResult
	var ea, eb error
	wg.Add(2)
	go func() { defer wg.Done(); ra, ea = a.Warm(ctx, items) }()
	go func() { defer wg.Done(); rb, eb = b.Warm(ctx, items) }()
	wg.Wait()
	if err := errors.Join(ea, eb); err != nil {
		t.Fatal(err)
	}
	if l.count() != n || ra.Loaded+rb.Loaded != n || ra.Failed+rb.Failed != 0 {
		t.Fatalf("two warm-ups: %d loads, results %+v and %+v; want %d loads in all", l.count(), ra, rb, n)
	}
	for i, it := range items {
		if v, src := get(t, a, it.Key, l.fixed("x", 0), minute); v != fmt.Sprint(i) || src != Hit {
			t.Fatalf("item %d after warm-up: %q %v", i, v, src)
		}
	}
	if r, err := a.Warm(ctx, items); err != nil || r.Fresh != n || l.count() != n {
		t.Fatalf("warming fresh entries: %+v %v, %d loads", r, err, l.count())
	}
	errUpstream := errors.New("upstream 502")
	bad := []WarmItem{
		{Key: mustKey(t, sc, "search", `{"q":"bad"}`), Policy: minute,
			Load: func(context.Context) ([]byte, bool, error) { return nil, false, errUpstream }},
		{Key: mustKey(t, sc, "search", `{"q":"good"}`), Policy: minute, Load: l.fixed("good", 0)},
	}
	if r, err := a.Warm(ctx, bad); !errors.Is(err, errUpstream) || r.Failed != 1 || r.Loaded != 1 {
		t.Fatalf("warm with a failing loader: %+v %v", r, err)
	}
	if _, err := a.Warm(ctx, []WarmItem{{Key: items[0].Key, Policy: Policy{}, Load: l.fixed("", 0)}}); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("invalid item: %v", err)
	}
}

func testCancelOneWaiter(t *testing.T, e storeEnv) {
	c := newCache(t, e.store(t), nil)
	k := mustKey(t, scope(t), "search", `{}`)
	started := make(chan struct{})
	loaderErr := make(chan error, 1)
	var once sync.Once
	load := func(ctx context.Context) ([]byte, bool, error) {
		once.Do(func() { close(started) })
		time.Sleep(300 * time.Millisecond)
		loaderErr <- ctx.Err()
		return []byte("v"), false, nil
	}
	// The first caller starts the flight, then gives up.
	ctx, cancel := context.WithCancel(context.Background())
	first := goGet(ctx, c, k, load, minute)
	<-started
	var others []<-chan result
	for range 5 {
		others = append(others, goGet(context.Background(), c, k, load, minute))
	}
	time.Sleep(50 * time.Millisecond)
	canceled := time.Now()
	cancel()
	r := <-first
	if !errors.Is(r.err, context.Canceled) || r.at.Sub(canceled) > 100*time.Millisecond {
		t.Fatalf("cancelled caller: %+v, returned %v after cancel", r, r.at.Sub(canceled))
	}
	for _, ch := range others {
		if r := <-ch; r.err != nil || r.v != "v" || r.src != Coalesced {
			t.Fatalf("other caller: %+v, want the value", r)
		}
	}
	if err := <-loaderErr; err != nil {
		t.Fatalf("the load's context ended with the first caller's: %v", err)
	}
	if st := c.Stats(); st.Loads != 1 || st.Coalesced != 5 {
		t.Fatalf("stats %+v, want 1 load and 5 coalesced", st)
	}
}

// testHolderCrash checks that when a lock holder dies without releasing
// (a crashed gateway), one waiter takes the lock over once it expires,
// without waiting for WaitTimeout or polling.
func testHolderCrash(t *testing.T, e storeEnv) {
	s := e.store(t)
	c := newCache(t, s, &Options{WaitTimeout: 10 * time.Second, PollInterval: 10 * time.Second})
	k := mustKey(t, scope(t), "search", `{}`)
	dead := acquireReq{entry: k.entry, scope: k.scope, token: "crashed", lockTTL: 300 * time.Millisecond,
		fenceTTL: time.Minute, mode: modeMiss}
	if r := s.acquire(context.Background(), []acquireReq{dead})[0]; r.err != nil || r.status != statusLocked {
		t.Fatalf("taking the lock: %+v", r)
	}
	t0 := time.Now()
	var l loads
	if v, src := get(t, c, k, l.fixed("v", 0), minute); v != "v" || src != Miss {
		t.Fatalf("after the holder crashed: %q %v", v, src)
	}
	if d := time.Since(t0); d < 250*time.Millisecond || d > 2*time.Second {
		t.Fatalf("took the lock over after %v, want about its 300ms TTL", d)
	}
}
