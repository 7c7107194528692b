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
	Loaded int // loaded under the lock (stored unless refused by the fence or not cacheable)
	Fresh  int // already fresh: not loaded
	Busy   int // another loader held the lock: left to it
	Failed int // loader or store errors (joined in Warm's error)
}

// plus returns the sums of r's and o's counts.
func (r WarmResult) plus(o WarmResult) WarmResult {
	return WarmResult{Loaded: r.Loaded + o.Loaded, Fresh: r.Fresh + o.Fresh, Busy: r.Busy + o.Busy, Failed: r.Failed + o.Failed}
}

// warmBatch is how many items share one pipeline of locks and one of
// commits.
const warmBatch = 64

// Warm fills the cache with items, typically at startup before the gateway
// reports ready. Items are handled in batches: one pipelined round trip
// takes the locks of a batch (skipping entries already fresh or being
// loaded by another instance, so instances starting together load each
// entry once), the loaders run Options.WarmConcurrency at a time, and one
// pipelined round trip stores the results.
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
	opTimeout := max(c.timeout, time.Second)
	reqs := make([]acquireReq, len(items))
	for i, it := range items {
		reqs[i] = c.acquireReq(it.Key, it.Policy, modeMiss, 0, c.token())
	}
	actx, cancel := context.WithTimeout(ctx, opTimeout)
	acq := c.store.acquire(actx, reqs)
	cancel()
	res, results, errs := c.warmLoads(ctx, items, acq)

	var commits []commitReq
	var releases []releaseReq
	for _, l := range results {
		it, q := items[l.i], reqs[l.i]
		switch {
		case l.err != nil:
			res.Failed++
			errs = append(errs, fmt.Errorf("cache: warm %s: %w", it.Key.tool, l.err))
			releases = append(releases, releaseReq{entry: q.entry, token: q.token})
		case l.late || l.neg && it.Policy.NegativeTTL == 0:
			res.Loaded++
			releases = append(releases, releaseReq{entry: q.entry, token: q.token})
		default:
			res.Loaded++
			commits = append(commits, commitReq{entry: q.entry, token: q.token, rec: l.rec})
		}
	}
	// Store even if ctx ended meanwhile: the loads are done.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if len(commits) > 0 {
		for _, r := range c.commit(sctx, commits) {
			if r.err != nil {
				errs = append(errs, fmt.Errorf("cache: warm commit: %w", r.err))
			}
		}
	}
	if len(releases) > 0 {
		c.release(sctx, releases)
	}
	return res, errs
}

// warmLoaded is the outcome of one warm-up load.
type warmLoaded struct {
	i    int // index of the item
	rec  record
	err  error
	neg  bool
	late bool // took longer than LoadTimeout: not stored (see loadLocked)
}

// warmLoads runs the loads of the items whose lock was acquired, at most
// warmN at a time, and counts the others (fresh, busy, failed) in res.
func (c *Cache) warmLoads(ctx context.Context, items []WarmItem, acq []acquireRes) (res WarmResult, results []warmLoaded, errs []error) {
	results = make([]warmLoaded, 0, len(items))
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
		go func(i int, fence uint64) {
			defer wg.Done()
			defer func() { <-sem }()
			it := items[i]
			v, neg, delta, err := c.call(ctx, it.Load)
			l := warmLoaded{i: i, err: err, neg: neg, late: delta > c.loadTimeout}
			if err == nil {
				l.rec = c.newRecord(v, neg, fence, delta, it.Key, it.Policy)
			}
			mu.Lock()
			results = append(results, l)
			mu.Unlock()
		}(i, a.fence)
	}
	wg.Wait()
	return res, results, errs
}
