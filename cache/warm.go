package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// WarmItem is one entry for Warm to fill.
type WarmItem struct {
	Key    Key
	Policy Policy
	Load   Loader
}

// WarmResult counts what Warm did with its items.
type WarmResult struct {
	Loaded int // loaded under the lock (stored unless refused by the fence, not cacheable, or late: see Warm)
	Fresh  int // already fresh: not loaded
	Busy   int // another loader held the lock: left to it
	Failed int // loader or store errors (joined in Warm's error)
}

// plus returns the sums of r's and o's counts.
func (r WarmResult) plus(o WarmResult) WarmResult {
	return WarmResult{Loaded: r.Loaded + o.Loaded, Fresh: r.Fresh + o.Fresh, Busy: r.Busy + o.Busy, Failed: r.Failed + o.Failed}
}

// warmBatch is how many items share one pipeline of locks.
const warmBatch = 64

// Warm fills the cache with items, typically at startup before the gateway
// reports ready. Items are handled in batches: one pipelined round trip
// takes the locks of a batch (skipping entries already fresh or being
// loaded by another instance, so instances starting together load each
// entry once), the loaders run Options.WarmConcurrency at a time, and each
// result is stored as its load ends, unless that is over LoadTimeout after
// its batch's locks were taken (its tag memberships, registered with the
// lock, would end before the entry: such a result is dropped, as a Get's
// load over LoadTimeout is not stored).
//
// Warm validates every item before any I/O (ErrInvalidKey,
// ErrInvalidPolicy). Loader and store errors do not stop it: they are
// counted and returned joined. Unlike Get, Warm's loads stop when ctx ends.
func (c *Cache) Warm(ctx context.Context, items []WarmItem) (WarmResult, error) {
	for i, it := range items {
		if it.Key.IsZero() {
			return WarmResult{}, fmt.Errorf("item %d: %w", i, ErrInvalidKey)
		}
		if it.Load == nil {
			return WarmResult{}, fmt.Errorf("item %d: %w: nil loader", i, ErrInvalidPolicy)
		}
		if err := it.Policy.validate(); err != nil {
			return WarmResult{}, fmt.Errorf("item %d: %w", i, err)
		}
	}
	var res WarmResult
	var errs []error
	for len(items) > 0 && ctx.Err() == nil {
		batch := items[:min(len(items), warmBatch)]
		items = items[len(batch):]
		n, berrs := c.warmBatch(ctx, batch)
		res, errs = res.plus(n), append(errs, berrs...)
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

// warmBatch warms one batch of items and returns what became of them.
func (c *Cache) warmBatch(ctx context.Context, items []WarmItem) (WarmResult, []error) {
	reqs := make([]acquireReq, len(items))
	for i, it := range items {
		reqs[i] = c.acquireReq(it.Key, it.Policy, modeMiss, 0, c.token())
	}
	// The tag memberships the acquire registers are sized for a load that
	// starts with it (acquireReq); the batch's loads wait for their turn
	// (WarmConcurrency), so each is measured from here.
	acquired := time.Now()
	actx, cancel := withOpTimeout(ctx, max(c.timeout, time.Second))
	acq := c.store.acquire(actx, reqs)
	cancel()
	return c.warmLoads(ctx, items, reqs, acq, acquired)
}

// warmLoads runs the loads of the items whose lock was acquired (at
// acquired), at most warmN at a time, and stores each result as its load
// ends; it counts the other items (fresh, busy, failed) too.
//
// A result is stored only if its load ended within LoadTimeout of the
// acquire, and its commit has until LoadTimeout + Timeout after it: the
// tag memberships end then plus the entry's life, so a later entry would
// outlive them, and an invalidation after they ended would not find it
// (the memory store serves an entry without checking them). The results
// are stored as they come rather than in one round trip at the end, which
// would make every result of a batch as late as its slowest load.
func (c *Cache) warmLoads(ctx context.Context, items []WarmItem, reqs []acquireReq, acq []acquireRes, acquired time.Time) (res WarmResult, errs []error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, c.warmN)
	for i, a := range acq {
		switch {
		case a.err != nil:
			res.Failed++
			c.storeError("warm lock", a.err)
			errs = append(errs, fmt.Errorf("cache: warm %s: %w", items[i].Key.tool, a.err))
			continue
		case a.status == statusFresh:
			res.Fresh++
			continue
		case a.status != statusLocked:
			res.Busy++
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(it WarmItem, q acquireReq, fence uint64) {
			defer wg.Done()
			defer func() { <-sem }()
			failed, err := c.warmOne(ctx, it, q, fence, acquired)
			mu.Lock()
			defer mu.Unlock()
			if failed {
				res.Failed++
			} else {
				res.Loaded++
			}
			if err != nil {
				errs = append(errs, err)
			}
		}(items[i], reqs[i], a.fence)
	}
	wg.Wait()
	return res, errs
}

// warmOne loads it under the lock (q, fence) acquired at acquired, and
// stores the result or releases the lock (see warmLoads). failed reports a
// load that failed; err is that or the commit's error.
func (c *Cache) warmOne(ctx context.Context, it WarmItem, q acquireReq, fence uint64, acquired time.Time) (failed bool, err error) {
	b := c.bounds(&it.Policy)
	v, neg, delta, err := c.call(ctx, it.Load, b.load)
	// Store even if ctx ended meanwhile: the load is done.
	sctx := context.WithoutCancel(ctx)
	late := time.Since(acquired) > b.load
	if err != nil || late || neg && it.Policy.NegativeTTL == 0 {
		c.release(sctx, []releaseReq{{entry: q.entry, token: q.token, lockTTL: b.lock}})
		if err != nil {
			return true, fmt.Errorf("cache: warm %s: %w", it.Key.tool, err)
		}
		if late {
			c.stats.uncached.Add(1)
		}
		return false, nil
	}
	rec := c.newRecord(v, neg, fence, delta, it.Key, it.Policy)
	cctx, cancel := withOpDeadline(sctx, acquired.Add(b.load+c.timeout))
	defer cancel()
	if r := c.commit(cctx, []commitReq{{entry: q.entry, token: q.token, rec: rec, lockTTL: b.lock}})[0]; r.err != nil {
		return false, fmt.Errorf("cache: warm commit: %w", r.err)
	}
	return false, nil
}
