package limittest

import (
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// The single-counter scenarios use a rule of capacity 5 (ruleFor) on a
// fresh counter, at the start of an hour (align) with no time passing
// between calls unless the scenario advances the clock.

// testBurst: a fresh counter admits exactly its capacity, then denies with
// the documented numbers.
func testBurst(c *tcase) {
	c.align()
	r := c.rule("burst", 5)
	ch := c.check(keyspace.PerTenant, r)
	for k := int64(1); k <= 5; k++ {
		var reset time.Duration
		switch c.alg {
		case limit.FixedWindow, limit.SlidingWindow:
			reset = time.Hour
		case limit.SlidingWindowCounter:
			reset = 2 * time.Hour // the units still weigh on the next window
		case limit.TokenBucket, limit.GCRA:
			reset = time.Duration(k) * bucketUnit
		case limit.Concurrency:
			reset = leasePeriod // the oldest lease
		}
		d := c.take(1, ch)
		c.expect(fmt.Sprintf("take %d", k), d, r, want{allowed: true, remaining: 5 - k, reset: reset})
	}
	w := want{remaining: 0}
	switch c.alg {
	case limit.FixedWindow, limit.SlidingWindow:
		w.reset, w.retry = time.Hour, time.Hour
	case limit.SlidingWindowCounter:
		// next window: 5 units weighted by (P-e)/P leave room for 1 at e = P/5
		w.reset, w.retry = 2*time.Hour, 2*time.Hour-4*time.Hour/5
	case limit.TokenBucket, limit.GCRA:
		w.reset, w.retry = 5*bucketUnit, bucketUnit
	case limit.Concurrency:
		w.reset, w.retry = leasePeriod, limit.ConcurrencyRetryHint
	}
	for k := range 3 { // denials change nothing
		c.expect(fmt.Sprintf("denied take %d", k+6), c.take(1, ch), r, w)
	}
	switch c.alg { // a cost of 2 needs two units back
	case limit.SlidingWindowCounter:
		w.retry = 2*time.Hour - 3*time.Hour/5
	case limit.TokenBucket, limit.GCRA:
		w.retry = 2 * bucketUnit
	}
	c.expect("denied cost 2", c.take(2, ch), r, w)
}

// testRefill: after exactly the announced time the same request is admitted
// (one step earlier it is not). For concurrency, whose RetryAfter is only a
// hint, the analogue is the expiry of the oldest lease (ResetAfter).
func testRefill(c *tcase) {
	c.align()
	r := c.rule("refill", 5)
	ch := c.check(keyspace.PerTenant, r)
	spaced := c.alg == limit.SlidingWindow || c.alg == limit.Concurrency
	for k := range 5 {
		if k > 0 && spaced { // one unit a minute, so the units leave one by one
			c.advance(time.Minute)
		}
		if d := c.take(1, ch); !d.Allowed {
			c.t.Fatalf("take %d denied on a fresh counter", k+1)
		}
	}
	d := c.take(1, ch)
	if d.Allowed {
		c.t.Fatal("take 6 admitted over capacity 5")
	}
	// The clock moves by the nominal wait, not by the RetryAfter reported:
	// on a real-time clock that one is shorter by the real time elapsed
	// since the first unit, and the clock would fall behind the schedule.
	var wait time.Duration
	switch c.alg {
	case limit.FixedWindow:
		wait = time.Hour
	case limit.SlidingWindow: // the first unit leaves 60m after it came, at +4m
		wait = time.Hour - 4*time.Minute
	case limit.SlidingWindowCounter:
		wait = 2*time.Hour - 4*time.Hour/5
	case limit.TokenBucket, limit.GCRA:
		wait = bucketUnit
	case limit.Concurrency:
		// RetryAfter is the hint; the oldest lease expires in 6m, the
		// newest (back to full capacity) in 10m
		c.near("concurrency ResetAfter (newest lease)", d.ResetAfter, leasePeriod)
		c.near("concurrency RetryAfter", d.RetryAfter, limit.ConcurrencyRetryHint)
		wait = leasePeriod - 4*time.Minute
	}
	if c.alg != limit.Concurrency {
		c.near("RetryAfter", d.RetryAfter, wait)
	}
	c.advance(wait - c.step())
	if d := c.take(1, ch); d.Allowed {
		c.t.Fatalf("admitted %v before the announced %v", c.step(), wait)
	}
	c.advance(c.step())
	d = c.take(1, ch)
	switch c.alg {
	case limit.FixedWindow: // a new window
		c.expect("new window", d, r, want{allowed: true, remaining: 4, reset: time.Hour})
		if n := c.exhaust(10, ch); n != 4 {
			c.t.Errorf("new window admitted %d more, want 4", n)
		}
	case limit.SlidingWindow: // the oldest unit left; four remain, one a minute
		c.expect("oldest unit left", d, r, want{allowed: true, remaining: 0, reset: time.Hour})
		c.expect("next unit", c.take(1, ch), r, want{reset: time.Hour, retry: time.Minute})
		c.advance(time.Minute)
		c.expect("next unit left", c.take(1, ch), r, want{allowed: true, remaining: 0, reset: time.Hour})
	case limit.SlidingWindowCounter:
		// at e = 12m of the next window the 5 previous units weigh 4
		c.expect("weighted window", d, r, want{allowed: true, remaining: 0, reset: 2*time.Hour - 12*time.Minute})
		// the next one fits when 5*(60-e)/60 + 2 <= 5: e >= 24m
		c.expect("weighted denial", c.take(1, ch), r, want{reset: 2*time.Hour - 12*time.Minute, retry: 12 * time.Minute})
		c.advance(12 * time.Minute)
		c.expect("weight 3", c.take(1, ch), r, want{allowed: true, remaining: 0, reset: 2*time.Hour - 24*time.Minute})
		c.advance(time.Hour - 24*time.Minute) // next window: 2 units weigh 2*(60-0)/60
		c.expect("two windows on", c.take(1, ch), r, want{allowed: true, remaining: 2, reset: 2 * time.Hour})
	case limit.TokenBucket, limit.GCRA:
		c.expect("one unit refilled", d, r, want{allowed: true, remaining: 0, reset: 5 * bucketUnit})
		c.advance(time.Hour) // refills to Burst, not beyond
		c.expect("refilled to burst", c.take(1, ch), r, want{allowed: true, remaining: 4, reset: bucketUnit})
		if n := c.exhaust(10, ch); n != 4 {
			c.t.Errorf("after a full refill %d more admitted, want 4 (Burst)", n)
		}
	case limit.Concurrency: // the oldest lease expired; the next one a minute later
		c.expect("oldest lease expired", d, r, want{allowed: true, remaining: 0, reset: leasePeriod})
		c.expect("next lease", c.take(1, ch), r, want{reset: leasePeriod, retry: limit.ConcurrencyRetryHint})
		c.advance(leasePeriod) // every lease expired
		c.expect("all leases expired", c.take(1, ch), r, want{allowed: true, remaining: 4, reset: leasePeriod})
	}
}

// testCost: a request of cost N is admitted only if all N units fit; a
// denied one charges nothing; a cost above capacity never fits.
func testCost(c *tcase) {
	c.align()
	r := c.rule("cost", 5)
	ch := c.check(keyspace.PerTenant, r)
	if c.alg == limit.Concurrency {
		// a call holds one slot whatever its cost, and no cost is too large
		c.expect("cost 10", c.take(10, ch), r, want{allowed: true, remaining: 4, reset: leasePeriod})
		c.expect("cost 3", c.take(3, ch), r, want{allowed: true, remaining: 3, reset: leasePeriod})
		for k := range 3 {
			c.expect(fmt.Sprintf("cost 7 #%d", k), c.take(7, ch), r, want{allowed: true, remaining: int64(2 - k), reset: leasePeriod})
		}
		c.expect("denied cost 100", c.take(100, ch), r, want{reset: leasePeriod, retry: limit.ConcurrencyRetryHint})
		return
	}
	fresh := c.check(keyspace.PerTenantTool, r)
	d := c.take(6, fresh)
	if d.Allowed || d.RetryAfter != limit.Never || d.Remaining != 5 {
		c.t.Errorf("cost 6 > capacity 5 on a fresh counter: %+v, want denied, RetryAfter Never, Remaining 5", d)
	}
	d = c.take(1<<40, fresh)
	if d.Allowed || d.RetryAfter != limit.Never {
		c.t.Errorf("cost 2^40: %+v, want denied with RetryAfter Never", d)
	}
	c.expect("fresh counter after cost 6", c.take(5, fresh), r, want{allowed: true, remaining: 0, reset: anyDuration})

	c.expect("cost 3", c.take(3, ch), r, want{allowed: true, remaining: 2, reset: anyDuration})
	d = c.take(6, ch)
	if d.Allowed || d.RetryAfter != limit.Never || d.Remaining != 2 {
		c.t.Errorf("cost 6 > capacity: %+v, want denied, RetryAfter Never, Remaining 2", d)
	}
	var retry3 time.Duration
	switch c.alg {
	case limit.FixedWindow, limit.SlidingWindow:
		retry3 = time.Hour
	case limit.SlidingWindowCounter:
		retry3 = 2*time.Hour - 2*time.Hour/3 // 3 units weigh 2 at e = P/3
	case limit.TokenBucket, limit.GCRA:
		retry3 = bucketUnit
	}
	c.expect("denied cost 3", c.take(3, ch), r, want{remaining: 2, reset: anyDuration, retry: retry3})
	c.expect("cost 1 after denials", c.take(1, ch), r, want{allowed: true, remaining: 1, reset: anyDuration})

	// the cost-2 request fits after exactly its RetryAfter
	var retry2 time.Duration
	var after int64
	switch c.alg {
	case limit.FixedWindow, limit.SlidingWindow:
		retry2, after = time.Hour, 3
	case limit.SlidingWindowCounter:
		retry2, after = 2*time.Hour-3*time.Hour/4, 0 // 4 units weigh 3 at e = P/4
	case limit.TokenBucket, limit.GCRA:
		retry2, after = bucketUnit, 0
	}
	c.expect("denied cost 2", c.take(2, ch), r, want{remaining: 1, reset: anyDuration, retry: retry2})
	c.advance(retry2 - c.step())
	if d := c.take(2, ch); d.Allowed {
		c.t.Errorf("cost 2 admitted %v before its RetryAfter", c.step())
	}
	c.advance(c.step())
	c.expect("cost 2 at its RetryAfter", c.take(2, ch), r, want{allowed: true, remaining: after, reset: anyDuration})
}

// testRefund: Refund gives back what Take charged.
func testRefund(c *tcase) {
	c.align()
	r := c.rule("refund", 5)
	ch := c.check(keyspace.PerTenant, r)
	d := c.take(2, ch)
	two := int64(3)
	if c.alg == limit.Concurrency {
		two = 4 // one slot whatever the cost
	}
	c.expect("cost 2", d, r, want{allowed: true, remaining: two, reset: anyDuration})
	c.refund(2, d.Lease, ch)
	d1 := c.take(1, ch)
	c.expect("after refund", d1, r, want{allowed: true, remaining: 4, reset: anyDuration})

	var leases []string
	if c.alg == limit.Concurrency {
		for range 4 {
			leases = append(leases, c.take(1, ch).Lease)
		}
	} else {
		d := c.take(4, ch)
		leases = append(leases, d.Lease)
		c.expect("cost 4", d, r, want{allowed: true, remaining: 0, reset: anyDuration})
	}
	if d := c.take(1, ch); d.Allowed {
		c.t.Fatal("admitted over capacity")
	}
	if c.alg == limit.Concurrency {
		c.refund(1, leases[2], ch)
	} else {
		c.refund(4, "", ch)
	}
	left := int64(3)
	if c.alg == limit.Concurrency {
		left = 0 // one slot came back
	}
	c.expect("after refund of cost 4", c.take(1, ch), r, want2(left))

	// A batch refunds every check; another tenant's counter is untouched.
	r2 := c.rule("refund-2", 5)
	batch := []limit.Check{c.check(keyspace.PerSubject, r2), c.check(keyspace.PerSubjectTool, r2)}
	d = c.take(3, batch...)
	if !d.Allowed {
		c.t.Fatalf("batch denied: %+v", d)
	}
	c.refund(3, d.Lease, batch...)
	for i, ch := range batch {
		c.expect(fmt.Sprintf("batch check %d after refund", i), c.take(1, ch), r2, want2(4))
	}
}

func want2(remaining int64) want {
	return want{allowed: true, remaining: remaining, reset: anyDuration}
}

// testRelease: Release frees concurrency slots (twice is harmless, an
// unknown lease too) and leaves every other algorithm alone.
func testRelease(c *tcase) {
	c.align()
	r := c.rule("release", 3)
	ch := c.check(keyspace.PerTenant, r)
	if c.alg != limit.Concurrency {
		d := c.take(2, ch)
		c.release(d.Lease, ch)
		c.release("some-lease", ch)
		c.expect("release is not a refund", c.take(1, ch), r, want2(0))
		// nor in a batch with a concurrency check
		k := ruleFor(limit.Concurrency, "release-k", 1)
		batch := []limit.Check{c.check(keyspace.PerSubject, r), c.check(keyspace.PerSubject, k)}
		d = c.take(1, batch...)
		c.release(d.Lease, batch...)
		c.expect("other algorithm after release", c.take(1, batch[0]), r, want2(1))
		c.expect("concurrency slot after release", c.take(1, batch[1]), k, want{allowed: true, remaining: 0, reset: leasePeriod})
		return
	}
	seen := map[string]bool{}
	var leases []string
	for k := range 3 {
		d := c.take(1, ch)
		if !d.Allowed || d.Lease == "" || seen[d.Lease] {
			c.t.Fatalf("take %d: %+v, want admitted under a new lease", k+1, d)
		}
		seen[d.Lease] = true
		leases = append(leases, d.Lease)
	}
	deny := want{reset: leasePeriod, retry: limit.ConcurrencyRetryHint}
	c.expect("full", c.take(1, ch), r, deny)
	c.release(leases[0], ch)
	d := c.take(1, ch)
	c.expect("after release", d, r, want{allowed: true, remaining: 0, reset: leasePeriod})
	c.release(leases[0], ch) // twice: frees nothing more
	c.release("unknown-lease", ch)
	c.release("", ch)
	c.expect("after double release", c.take(1, ch), r, deny)
	c.release(d.Lease, ch)
	c.release(leases[1], ch)
	c.expect("after two releases", c.take(1, ch), r, want{allowed: true, remaining: 1, reset: leasePeriod})

	// Releasing a batch frees its concurrency slot only.
	tb := ruleFor(limit.TokenBucket, "release-tb", 5)
	k := c.rule("release-k", 1)
	batch := []limit.Check{c.check(keyspace.PerSubject, tb), c.check(keyspace.PerSubject, k)}
	d = c.take(1, batch...)
	c.expect("batch", d, k, want{allowed: true, remaining: 0, reset: leasePeriod})
	c.release(d.Lease, batch...)
	c.expect("token bucket after release", c.take(1, batch[0]), tb, want{allowed: true, remaining: 3, reset: 2 * bucketUnit})

	// A lease nobody releases frees itself after the rule's Period.
	c.expect("slot after release", c.take(1, batch[1]), k, want{allowed: true, remaining: 0, reset: leasePeriod})
	c.advance(leasePeriod - c.step())
	c.expect("lease not yet expired", c.take(1, batch[1]), k, want{reset: c.step(), retry: c.step()})
	c.advance(c.step())
	c.expect("lease expired", c.take(1, batch[1]), k, want{allowed: true, remaining: 0, reset: leasePeriod})
}

// testInvalid: every store rejects what limit.Validate rejects, before
// charging anything.
func testInvalid(c *tcase) {
	r := c.rule("invalid", 2)
	ch := c.check(keyspace.PerTenant, r)
	st := c.h.Store
	_, err := st.Take(c.ctx, []limit.Check{ch}, 0)
	c.expectErr("Take cost 0", err, limit.ErrInvalidCost)
	_, err = st.Take(c.ctx, []limit.Check{ch}, -1)
	c.expectErr("Take cost -1", err, limit.ErrInvalidCost)
	_, err = st.Take(c.ctx, nil, 1)
	c.expectErr("Take no checks", err, limit.ErrNoChecks)
	c.expectErr("Refund cost 0", st.Refund(c.ctx, []limit.Check{ch}, 0, ""), limit.ErrInvalidCost)

	bad := []limit.Rule{r, r, r, r}
	bad[0].Limit = 0
	bad[1].Period = 0
	bad[2].Name = ""
	bad[3].Period = time.Second + time.Nanosecond
	for i, b := range bad {
		_, err := st.Take(c.ctx, []limit.Check{ch, {Rule: b, Key: ch.Key + "-bad"}}, 1)
		c.expectErr(fmt.Sprintf("Take with bad rule %d", i), err, limit.ErrInvalidRule)
	}
	_, err = st.Take(c.ctx, []limit.Check{ch, {Rule: r, Key: ""}}, 1)
	c.expectErr("Take with an empty key", err, limit.ErrInvalidRule)
	// none of the failed calls charged the valid check
	c.expect("after invalid calls", c.take(1, ch), r, want2(1))
}
