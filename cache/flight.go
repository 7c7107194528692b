package cache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"runtime/debug"
	"time"
)

// This file is a flight's work: start or join one, find or load a value
// under the store's lock, wait for another loader, refresh early.

// join runs or joins the in-process flight of key. storeErr, from the
// caller's read, makes a new flight load without the store.
//
// A flight started before an invalidation of this Cache is not joined: its
// load may have read the data the invalidated write replaced, and a caller
// that begins after Invalidate returned must see that write. The caller
// starts a new flight instead (it waits for the old one's lock, whose
// value the bumped fence keeps out of the store, then loads), which later
// callers join; the old flight still answers the callers that joined it
// before. The counter is one for all keys: an invalidation of other tags
// only costs the next caller of a key in flight a lock round trip (it then
// gets the old flight's stored value), where a count per tag would take a
// map that client-chosen tags could grow without bound.
//
// An invalidation through another Cache sharing the store is not counted
// here; it shows as the fence refusing the flight's commit. The callers
// that joined that flight then start over (up to maxRejoin times), as any
// of them may have begun after that invalidation returned. The flight's
// own caller keeps its value: it began before the lock was taken, so
// before the fence was bumped.
//
// A load without the store (the lock not had within WaitTimeout, or the
// store failing) has no commit, so no fence can refuse it: such a flight
// leaves the flights a Get joins before its load starts (unlist). The
// callers that boarded before began before the load read anything; a
// caller that comes later starts a flight of its own, so one that begins
// after an invalidation through another instance never gets a value read
// before it. The cost: while the store fails (a read failing starts a
// load at once), the Gets of a key are not coalesced either.
func (c *Cache) join(ctx context.Context, key Key, load Loader, pol Policy, storeErr error) (Entry, Source, error) {
	for rejoined := 0; ; rejoined++ {
		f, follower, err := c.board(ctx, key, load, pol, storeErr)
		if err != nil {
			return Entry{}, 0, err
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return Entry{}, 0, ctx.Err()
		}
		if follower && f.fenced && f.err == nil && rejoined < maxRejoin {
			storeErr = nil
			continue
		}
		return c.served(f, follower)
	}
}

// maxRejoin bounds how often one Get starts over because the flight it
// joined was refused by the fence (see join): each time takes an
// invalidation or a newer load during a load, so this only ends a run of
// them; the last flight's value is served.
const maxRejoin = 2

// board returns the flight of key to wait for, starting one unless a
// flight started since the last invalidation of this Cache is running
// (follower set then).
func (c *Cache) board(ctx context.Context, key Key, load Loader, pol Policy, storeErr error) (f *flight, follower bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, false, ErrClosed
	}
	gen := c.invalidations.Load()
	if f, follower = c.flights[key.entry]; follower && f.gen == gen {
		return f, true, nil
	}
	f = &flight{done: make(chan struct{}), gen: gen}
	if storeErr == nil { // else f loads without the store at once: see unlist
		c.flights[key.entry] = f
	}
	c.wg.Add(1)
	go c.fly(context.WithoutCancel(ctx), key, load, pol, f, storeErr)
	return f, false, nil
}

// served returns the outcome of the ended flight f to one of its callers
// (follower: one that did not start it), counting it.
func (c *Cache) served(f *flight, follower bool) (Entry, Source, error) {
	if f.err != nil {
		return Entry{}, 0, f.err
	}
	src := f.src
	if follower && src == Miss {
		src = Coalesced
	}
	if f.entry.StoreErr != nil {
		c.stats.degraded.Add(1)
	}
	switch src {
	case Miss:
		c.stats.misses.Add(1)
	case Stale:
		c.stats.stale.Add(1)
	default:
		c.stats.coalesced.Add(1)
	}
	return f.entry, src, nil
}

func (c *Cache) fly(ctx context.Context, key Key, load Loader, pol Policy, f *flight, storeErr error) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		// A newer flight of the key (started after an invalidation) may
		// have replaced f: it stays for its own callers.
		if c.flights[key.entry] == f {
			delete(c.flights, key.entry)
		}
		c.mu.Unlock()
		close(f.done)
	}()
	if storeErr != nil {
		// The store just failed this key's read: asking it for the lock
		// would most likely cost another timeout.
		// board did not list f (see unlist).
		f.entry, f.src, f.err = c.loadDegraded(ctx, load, c.bounds(&pol).load, storeErr)
		return
	}
	f.entry, f.src, f.fenced, f.err = c.resolve(ctx, key, load, pol, f)
}

// unlist takes f out of the flights later Gets of key join, before it
// loads without the store: that load has no commit, so no fence tells its
// callers that an invalidation through another instance came during it
// (see join). The callers already on board began before the load did.
func (c *Cache) unlist(key Key, f *flight) {
	c.mu.Lock()
	if c.flights[key.entry] == f {
		delete(c.flights, key.entry)
	}
	c.mu.Unlock()
}

// maxResubscribe bounds how often one wait re-subscribes after the store
// dropped its subscription, before falling back to polling.
const maxResubscribe = 3

// resolve finds or loads the value of key for one flight: it takes the
// lock and loads, or waits for the lock holder's value (woken by the
// store), and when waiting times out serves the stale copy or loads
// without storing (f is unlisted first). fenced reports a load whose
// commit the fence refused (see loadLocked).
func (c *Cache) resolve(ctx context.Context, key Key, load Loader, pol Policy, f *flight) (_ Entry, _ Source, fenced bool, _ error) {
	b := c.bounds(&pol)
	deadline := time.Now().Add(b.wait)
	var sub subscription
	defer func() {
		if sub != nil {
			sub.close()
		}
	}()
	subscribes := 0
	for {
		if sub != nil {
			sub.arm()
		}
		// Taken before the lock attempt, so that a breaker opening after
		// it ends the wait below.
		var down <-chan struct{} // nil without a breaker: never ready
		if c.guard != nil {
			down = c.guard.opened()
		}
		token := c.token()
		res := c.acquireOne(ctx, key, pol, modeMiss, 0, token)
		switch {
		case res.err != nil:
			c.storeError("lock", res.err)
			c.unlist(key, f)
			e, src, err := c.loadDegraded(ctx, load, b.load, res.err)
			return e, src, false, err
		case res.status == statusFresh:
			return res.rec.entry(), Coalesced, false, nil
		case res.status == statusLocked:
			return c.loadLocked(ctx, key, load, pol, res.fence, token, false)
		}
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		// Busy: subscribe, then check again before waiting, so that a
		// value landing meanwhile is not missed.
		if (sub == nil || !sub.alive()) && subscribes <= maxResubscribe {
			if sub != nil {
				sub.close()
				sub = nil
			}
			subscribes++
			sctx, cancel := withOpTimeout(ctx, c.timeout)
			s, err := c.store.subscribe(sctx, key.entry)
			cancel()
			if err == nil {
				sub = s
				continue
			}
			if !errors.Is(err, errNoPubSub) {
				c.storeError("subscribe", err)
			}
		}
		c.pause(sub, res.wait, left, down)
	}
	rec, ok, err := c.read(ctx, key, pol.Tags)
	var e Entry
	var src Source
	switch {
	case err != nil:
		c.unlist(key, f)
		e, src, err = c.loadDegraded(ctx, load, b.load, err)
	case !ok:
		c.unlist(key, f)
		e, src, err = c.loadUncached(ctx, load, b.load)
	case rec.fresh() > 0:
		e, src = rec.entry(), Coalesced
	default:
		e, src = rec.entry(), Stale
	}
	return e, src, false, err
}

// pause waits, at most left, for a wake-up of sub, the end of the lock
// (lockWait; 0: unknown), a poll interval when sub cannot wake it, or the
// breaker opening (down): then the next lock attempt is skipped and the
// flight loads without the store.
func (c *Cache) pause(sub subscription, lockWait, left time.Duration, down <-chan struct{}) {
	wait := min(left, lockWait+time.Millisecond)
	var wake <-chan struct{}
	if sub != nil && sub.alive() {
		wake = sub.wake()
	} else {
		wait = min(wait, c.poll)
	}
	if lockWait <= 0 {
		wait = min(wait, c.poll)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C:
	case <-down:
	}
}

func (c *Cache) acquireOne(ctx context.Context, key Key, pol Policy, mode acquireMode, seen uint64, token string) acquireRes {
	ctx, cancel := withOpTimeout(ctx, c.timeout)
	defer cancel()
	ctx, span := c.storeSpan(ctx, "lock")
	res := c.store.acquire(ctx, []acquireReq{c.acquireReq(key, pol, mode, seen, token)})[0]
	endStoreSpan(span, res.err)
	return res
}

func (c *Cache) acquireReq(key Key, pol Policy, mode acquireMode, seen uint64, token string) acquireReq {
	// The membership outlives the longest life the entry can get from a
	// load starting now: a load longer than its bound is not stored, and
	// its commit takes at most Timeout. It also bounds how long an entry a
	// lost invalidation missed can be served (Options.MaxPendingInvalidations).
	b := c.bounds(&pol)
	life := b.load + c.timeout + max(pol.TTL, pol.NegativeTTL) + c.stale + 100*time.Millisecond
	if c.guard != nil {
		c.guard.noteLife(life)
	}
	return acquireReq{
		entry: key.entry, scope: key.scope, tags: pol.Tags, tagLife: life,
		token: token, lockTTL: b.lock, fenceTTL: b.fence, mode: mode, seen: seen,
	}
}

// loadGrace is how long a load is waited for after its context ended
// (its bound): room for a Loader that honours its context to notice and
// return (or, on a loaded machine, to be scheduled at all), before it is
// taken for one that ignores it and abandoned.
const loadGrace = time.Second

// loaded is what one Loader call returned, and how long it took.
type loaded struct {
	v     []byte
	neg   bool
	delta time.Duration
	err   error
}

// call runs load under timeout (its bounds' load), turning a panic into
// ErrLoaderPanic, and measures it.
//
// The Loader runs on a goroutine of its own, so that one ignoring its
// context cannot hold up what waits for it: every caller of the flight,
// the entry's lock, and Close. Once its context has ended (timeout, or
// Warm's ctx) and loadGrace has passed without it returning, call returns
// ErrLoaderAbandoned (wrapping the context's error) and leaves the Loader
// to end on its own: nothing waits for it any more, Close included, and
// its result is dropped.
func (c *Cache) call(ctx context.Context, load Loader, timeout time.Duration) (v []byte, neg bool, delta time.Duration, err error) {
	c.stats.loads.Add(1)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	// Buffered: an abandoned Loader's goroutine still ends when it returns.
	out := make(chan loaded, 1)
	go func() {
		var l loaded
		defer func() {
			l.delta = time.Since(start)
			if r := recover(); r != nil {
				c.log.Error("cache: loader panicked", "panic", r, "stack", string(debug.Stack()))
				l.v, l.neg, l.err = nil, false, fmt.Errorf("%w: %v", ErrLoaderPanic, r)
			}
			out <- l
		}()
		l.v, l.neg, l.err = load(ctx)
	}()
	var l loaded
	select {
	case l = <-out:
		return l.v, l.neg, l.delta, l.err
	case <-ctx.Done():
	}
	grace := time.NewTimer(loadGrace)
	defer grace.Stop()
	select {
	case l = <-out:
		return l.v, l.neg, l.delta, l.err
	case <-grace.C:
	}
	c.log.Warn("cache: loader ignored the end of its context; abandoned", "after", time.Since(start).Round(time.Millisecond))
	return nil, false, time.Since(start), fmt.Errorf("%w %v after its context ended: %w", ErrLoaderAbandoned, loadGrace, ctx.Err())
}

// loadLocked loads under the lock (fence) and stores the result if it is
// cacheable and the fence is still current. An early refresh (refresh set)
// does not store a negative result: the positive value it would replace is
// still fresh. fenced reports that the commit was refused by the fence: an
// invalidation (possibly through another instance) or a newer load came
// during the load, whose value may be older than what they saw.
func (c *Cache) loadLocked(ctx context.Context, key Key, load Loader, pol Policy, fence uint64, token string, refresh bool) (_ Entry, _ Source, fenced bool, _ error) {
	b := c.bounds(&pol)
	v, neg, delta, err := c.call(ctx, load, b.load)
	if err != nil || (neg && (pol.NegativeTTL == 0 || refresh)) {
		c.release(ctx, []releaseReq{{entry: key.entry, token: token, lockTTL: b.lock}})
		if err != nil {
			return Entry{}, 0, false, err
		}
		return Entry{Value: v, Negative: true}, Miss, false, nil
	}
	if delta > b.load {
		// A Loader that ignored its context: its entry could outlive its
		// tag memberships (sized for its bound), so do not store it.
		c.stats.uncached.Add(1)
		c.release(ctx, []releaseReq{{entry: key.entry, token: token, lockTTL: b.lock}})
		return Entry{Value: v, Negative: neg}, Miss, false, nil
	}
	rec := c.newRecord(v, neg, fence, delta, key, pol)
	cctx, cancel := withOpTimeout(ctx, c.timeout)
	res := c.commit(cctx, []commitReq{{entry: key.entry, token: token, rec: rec, lockTTL: b.lock}})
	cancel()
	return Entry{Value: v, Negative: neg, TTL: rec.fresh()}, Miss, res[0].fenced, nil
}

// commit stores loaded records under their locks (ctx bounds the wait;
// a lockTTL not given is LockTTL) and counts the results.
func (c *Cache) commit(ctx context.Context, reqs []commitReq) []commitRes {
	for i := range reqs {
		reqs[i].lockTTL = or(reqs[i].lockTTL, c.lockTTL)
	}
	ctx, span := c.storeSpan(ctx, "write")
	out := c.store.commit(ctx, reqs)
	var failed error
	for _, res := range out {
		failed = cmp.Or(failed, res.err)
	}
	endStoreSpan(span, failed)
	var skipped []releaseReq
	for i, res := range out {
		switch {
		case errors.Is(res.err, ErrStoreSkipped):
			skipped = append(skipped, releaseReq{entry: reqs[i].entry, token: reqs[i].token, lockTTL: reqs[i].lockTTL})
		case res.err != nil:
			c.storeError("commit", res.err)
		case !res.stored:
			c.stats.rejected.Add(1)
		}
	}
	c.unlockSkipped(skipped)
	return out
}

// newRecord builds the stored form of a loaded value of key: the TTL
// shortened by jitter, the stale window (none for negative results), and
// the tag indexes its acquire registered it in (pol.Tags in key's scope),
// which a read checks still list it.
func (c *Cache) newRecord(v []byte, neg bool, fence uint64, delta time.Duration, key Key, pol Policy) record {
	ttl, stale := pol.TTL, c.stale
	if neg {
		ttl, stale = pol.NegativeTTL, 0
	}
	if pol.Jitter > 0 {
		ttl -= time.Duration(float64(ttl) * pol.Jitter * mrand.Float64())
	}
	ttl = max(ttl, time.Millisecond)
	// A load measured as instant still gets a positive delta, as Redis
	// stores it: XFetch never refreshes an entry whose delta is 0.
	delta = max(delta, time.Millisecond)
	return record{value: v, negative: neg, fence: fence, delta: delta, stale: stale, life: ttl + stale, tags: tagKeys(key.scope, pol.Tags)}
}

// release gives up the locks of reqs (a lockTTL not given is LockTTL).
func (c *Cache) release(ctx context.Context, reqs []releaseReq) {
	for i := range reqs {
		reqs[i].lockTTL = or(reqs[i].lockTTL, c.lockTTL)
	}
	ctx, cancel := withOpTimeout(ctx, c.timeout)
	defer cancel()
	ctx, span := c.storeSpan(ctx, "unlock")
	errs := c.store.release(ctx, reqs)
	if span != nil {
		endStoreSpan(span, errors.Join(errs...))
	}
	var skipped []releaseReq
	for i, err := range errs {
		switch {
		case errors.Is(err, ErrStoreSkipped):
			skipped = append(skipped, reqs[i])
		case err != nil:
			c.storeError("unlock", err)
		}
	}
	c.unlockSkipped(skipped)
}

// unlockSkipped releases locks this instance holds whose commit or release
// the breaker skipped (it opened during their loads), in the background:
// the caller does not wait for a store the breaker says is down, and the
// lock does not outlive the load, which would make every instance's
// waiters wait for its whole TTL. Errors are ignored: the lock then ends
// with its TTL.
func (c *Cache) unlockSkipped(reqs []releaseReq) {
	if len(reqs) == 0 || c.guard == nil {
		return
	}
	unlock := func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		c.guard.Store.release(ctx, reqs) // past the breaker
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		unlock()
	}()
}

// loadUncached loads without the lock, within timeout; the result is not
// stored.
func (c *Cache) loadUncached(ctx context.Context, load Loader, timeout time.Duration) (Entry, Source, error) {
	c.stats.uncached.Add(1)
	v, neg, _, err := c.call(ctx, load, timeout)
	if err != nil {
		return Entry{}, 0, err
	}
	return Entry{Value: v, Negative: neg}, Miss, nil
}

// loadDegraded is loadUncached because the store failed with storeErr.
func (c *Cache) loadDegraded(ctx context.Context, load Loader, timeout time.Duration, storeErr error) (Entry, Source, error) {
	e, src, err := c.loadUncached(ctx, load, timeout)
	if err == nil {
		e.StoreErr = storeErr
	}
	return e, src, err
}

// refresh starts an early refresh of key in the background, unless one is
// running or a flight is loading the key. Its Loader's ctx is marked
// (Refreshing): it outlives the hit that started it.
func (c *Cache) refresh(ctx context.Context, key Key, load Loader, pol Policy, seen uint64) {
	c.mu.Lock()
	_, busy := c.refreshing[key.entry]
	_, loading := c.flights[key.entry]
	if c.closed || busy || loading {
		c.mu.Unlock()
		return
	}
	c.refreshing[key.entry] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		defer func() {
			c.mu.Lock()
			delete(c.refreshing, key.entry)
			c.mu.Unlock()
		}()
		ctx := context.WithValue(context.WithoutCancel(ctx), refreshKey{}, true)
		token := c.token()
		res := c.acquireOne(ctx, key, pol, modeRefresh, seen, token)
		if res.err != nil {
			c.storeError("lock", res.err)
			return
		}
		if res.status != statusLocked {
			return
		}
		c.stats.refreshes.Add(1)
		if _, _, _, err := c.loadLocked(ctx, key, load, pol, res.fence, token, true); err != nil {
			c.log.Debug("cache: early refresh failed", "tool", key.tool, "err", err)
		}
	}()
}
