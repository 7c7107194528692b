package limittest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// The breaker scenarios of an open breaker's life: the half-open probe,
// backoff, the probe's lease, denials added from outside, listing and
// reset, and the keys' TTLs.

// testBreakerHalfOpen: after the cooldown exactly one of 64 concurrent
// callers is let through as the probe; its success closes the breaker.
func testBreakerHalfOpen(c *tcase) {
	c.align()
	tenant := "br-half-" + c.id
	r := ruleFor(limit.FixedWindow, "half", 1000)
	ch := tenantCheck(tenant, r)
	sp := breakerSpec(tenant, "h")
	sp.ConsecutiveFailures = 1
	c.openByFailure("open", sp)
	req := guarded(sp, nil, ch)
	c.advance(brCooldown - c.step())
	c.expectBreaker("just before the cooldown ends", c.eval("open", req).Breaker,
		brWant{open: true, reason: limit.ReasonFailures, failures: 1, retry: c.step()})
	c.advance(c.step())

	const workers = 64
	var mu sync.Mutex
	var probes, denied int
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			o, err := c.gs().Evaluate(c.ctx, req)
			if err != nil {
				c.t.Errorf("Evaluate: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case o.Breaker.Probe && o.Decision.Allowed:
				probes++
			case o.Breaker.Open && o.Breaker.HalfOpen && o.Breaker.RetryAfter > 0 && o.Breaker.RetryAfter <= brLease:
				denied++
			default:
				c.t.Errorf("a caller of the half-open breaker got %+v", o)
			}
		})
	}
	close(start)
	wg.Wait()
	if probes != 1 || denied != workers-1 {
		c.t.Errorf("half-open: %d probes and %d denials among %d callers, want exactly 1 probe", probes, denied, workers)
	}
	c.expect("check after the probe", c.take(1, ch), r, want2(1000-1-1))
	c.expectBreaker("the probe's success", c.report("probe success", sp, false, true), brWant{})
	o := c.eval("after the probe's success", req)
	if !o.Decision.Allowed {
		c.t.Errorf("after the probe's success: %+v, want admitted", o)
	}
	c.expectBreaker("after the probe's success", o.Breaker, brWant{})
	if ttl, ok := c.tenantTTLs(tenant)[sp.Key]; ok {
		c.t.Errorf("a closed breaker with no counts is still held (TTL %v)", ttl)
	}
}

// testBreakerBackoff: a failed probe reopens the breaker for twice the
// cooldown, at most MaxCooldown; a successful probe brings the cooldown
// back to Cooldown.
func testBreakerBackoff(c *tcase) {
	tenant := "br-backoff-" + c.id
	sp := breakerSpec(tenant, "b")
	sp.ConsecutiveFailures = 1
	sp.MaxCooldown = 3 * time.Minute
	c.openByFailure("open", sp)
	cd := brCooldown
	failures := int64(1)
	for k, next := range []time.Duration{2 * time.Minute, 3 * time.Minute, 3 * time.Minute} {
		c.advance(cd - c.step())
		c.expectBreaker(fmt.Sprintf("round %d: before the cooldown ends", k), c.eval("open", alone(sp)).Breaker,
			brWant{open: true, reason: reasonOf(k), failures: failures, cooldown: cd, retry: c.step()})
		c.advance(c.step())
		c.expectBreaker(fmt.Sprintf("round %d: probe", k), c.eval("probe", alone(sp)).Breaker,
			brWant{probe: true, reason: reasonOf(k), failures: failures, cooldown: cd})
		failures++
		c.expectBreaker(fmt.Sprintf("round %d: failed probe", k), c.report("failed probe", sp, true, true),
			brWant{open: true, opened: true, reason: limit.ReasonProbeFailed, failures: failures, cooldown: next, retry: next})
		cd = next
	}
	c.advance(cd)
	c.expectBreaker("last probe", c.eval("probe", alone(sp)).Breaker,
		brWant{probe: true, reason: limit.ReasonProbeFailed, failures: failures, cooldown: cd})
	c.expectBreaker("successful probe", c.report("successful probe", sp, false, true), brWant{})
	c.expectBreaker("reopened", c.report("failure", sp, true, false),
		brWant{open: true, opened: true, reason: limit.ReasonFailures, failures: 1, retry: brCooldown})
}

func reasonOf(round int) string {
	if round == 0 {
		return limit.ReasonFailures
	}
	return limit.ReasonProbeFailed
}

// testBreakerProbeLease: a probe whose outcome never comes holds the
// breaker for ProbeLease, then another probe may go; a probe the checks
// deny frees the breaker at once and is not counted.
func testBreakerProbeLease(c *tcase) {
	c.align()
	tenant := "br-lease-" + c.id
	sp := breakerSpec(tenant, "l")
	sp.ConsecutiveFailures = 1
	sp.ConsecutiveDenials = 2
	c.openByFailure("open", sp)
	c.advance(brCooldown)
	probe := brWant{probe: true, reason: limit.ReasonFailures, failures: 1}
	c.expectBreaker("first probe", c.eval("probe", alone(sp)).Breaker, probe)
	held := brWant{open: true, halfOpen: true, reason: limit.ReasonFailures, failures: 1, retry: brLease}
	c.expectBreaker("probe in flight", c.eval("in flight", alone(sp)).Breaker, held)
	c.advance(brLease - c.step())
	held.retry = c.step()
	c.expectBreaker("just before the lease ends", c.eval("in flight", alone(sp)).Breaker, held)
	c.advance(c.step())
	c.expectBreaker("second probe, the first one's lease ended", c.eval("probe", alone(sp)).Breaker, probe)

	// A probe the checks deny.
	c.advance(brLease)
	r1 := ruleFor(limit.FixedWindow, "lease-1", 1)
	ch1 := tenantCheck(tenant, r1)
	c.take(1, ch1)
	for k := range 3 {
		o := c.eval("denied probe", guarded(sp, nil, ch1))
		if o.Decision.Allowed || o.Decision.Rule != r1 {
			c.t.Errorf("denied probe %d: %+v, want denied by %s", k, o.Decision, r1.Name)
		}
		// not the probe, not counted as a denial of a closed breaker
		c.expectBreaker(fmt.Sprintf("denied probe %d", k), o.Breaker, brWant{reason: limit.ReasonFailures, failures: 1})
	}
	c.expectBreaker("probe after denied ones", c.eval("probe", alone(sp)).Breaker, probe)
	c.expectBreaker("the probe's failure", c.report("failed probe", sp, true, true),
		brWant{open: true, opened: true, reason: limit.ReasonProbeFailed, failures: 2, cooldown: 2 * brCooldown, retry: 2 * brCooldown})
}

// testBreakerReleaseProbe: ReleaseProbe frees the lease of the probe in
// flight (the next call becomes the probe, and may close the breaker), and
// leaves any other breaker as it is: closed, open, half-open with no probe
// in flight, or one the store does not hold.
func testBreakerReleaseProbe(c *tcase) {
	c.align()
	tenant := "br-release-" + c.id
	release := func(label string, sp limit.BreakerSpec) {
		c.t.Helper()
		if err := c.gs().ReleaseProbe(c.ctx, sp); err != nil {
			c.t.Fatalf("%s: ReleaseProbe: %v", label, err)
		}
	}
	// Not held, closed with counts: nothing to do, nothing created.
	none := breakerSpec(tenant, "none")
	none.ConsecutiveFailures = 1
	release("unknown breaker", none)
	if ttl, ok := c.tenantTTLs(tenant)[none.Key]; ok {
		c.t.Errorf("ReleaseProbe created the breaker it was not holding (TTL %v)", ttl)
	}
	closed := breakerSpec(tenant, "closed")
	closed.ConsecutiveFailures = 3
	c.report("one failure", closed, true, false)
	release("closed breaker", closed)
	c.expectBreaker("closed after ReleaseProbe", c.report("second failure", closed, true, false), brWant{failures: 2})

	sp := breakerSpec(tenant, "r")
	sp.ConsecutiveFailures = 1
	c.openByFailure("open", sp)
	release("open breaker", sp) // no probe to free: still open for the cooldown
	c.advance(brCooldown - c.step())
	c.expectBreaker("open after ReleaseProbe", c.eval("open", alone(sp)).Breaker,
		brWant{open: true, reason: limit.ReasonFailures, failures: 1, retry: c.step()})
	c.advance(c.step())

	probe := brWant{probe: true, reason: limit.ReasonFailures, failures: 1}
	held := brWant{open: true, halfOpen: true, reason: limit.ReasonFailures, failures: 1, retry: brLease}
	c.expectBreaker("first probe", c.eval("probe", alone(sp)).Breaker, probe)
	c.expectBreaker("probe in flight", c.eval("in flight", alone(sp)).Breaker, held)
	release("probe in flight", sp)
	c.expectBreaker("next call after the release", c.eval("probe", alone(sp)).Breaker, probe)
	c.expectBreaker("its probe in flight", c.eval("in flight", alone(sp)).Breaker, held)
	c.advance(c.step())
	release("second probe", sp)
	release("again", sp) // half-open with no probe in flight: nothing
	c.expectBreaker("third probe", c.eval("probe", alone(sp)).Breaker, probe)
	c.expectBreaker("the third probe's success", c.report("probe success", sp, false, true), brWant{})
	release("closed by the probe", sp)
	c.expectBreaker("closed", c.eval("closed", alone(sp)).Breaker, brWant{})
	if ttl, ok := c.tenantTTLs(tenant)[sp.Key]; ok {
		c.t.Errorf("a closed breaker with no counts is still held after ReleaseProbe (TTL %v)", ttl)
	}

	c.expectErr("ReleaseProbe without a key", c.gs().ReleaseProbe(c.ctx, limit.BreakerSpec{Cooldown: brCooldown, MaxCooldown: brMax, ProbeLease: brLease}), limit.ErrInvalidBreaker)
}

// testBreakerAddDenials: denials answered elsewhere count toward
// ConsecutiveDenials and may open the breaker.
func testBreakerAddDenials(c *tcase) {
	tenant := "br-add-" + c.id
	sp := breakerSpec(tenant, "a")
	sp.ConsecutiveDenials = 5
	c.expectBreaker("add 2", c.addDenials("add 2", sp, 2), brWant{denials: 2})
	c.expectBreaker("add 2 more", c.addDenials("add 2", sp, 2), brWant{denials: 4})
	c.expectBreaker("admission", c.eval("admission", alone(sp)).Breaker, brWant{})
	c.expectBreaker("add 4", c.addDenials("add 4", sp, 4), brWant{denials: 4})
	c.expectBreaker("add 1", c.addDenials("add 1", sp, 1),
		brWant{open: true, opened: true, reason: limit.ReasonDenials, denials: 5, retry: brCooldown})
	c.expectBreaker("call", c.eval("open", alone(sp)).Breaker, brWant{open: true, reason: limit.ReasonDenials, denials: 5, retry: brCooldown})
	c.expectBreaker("add while open", c.addDenials("add 3", sp, 3), brWant{open: true, reason: limit.ReasonDenials, denials: 8, retry: brCooldown})
	for _, n := range []int64{0, -1, limit.MaxBreakerCount + 1} {
		_, err := c.gs().AddDenials(c.ctx, sp, n)
		c.expectErr(fmt.Sprintf("AddDenials(%d)", n), err, limit.ErrInvalidBreaker)
	}
}

// testBreakerListReset: ListBreakers reports the open and half-open
// breakers as stored; ResetBreaker closes one, identical-calls count
// included.
func testBreakerListReset(c *tcase) {
	tenant := "br-list-" + c.id
	half := breakerSpec(tenant, "half")
	half.ConsecutiveFailures = 1
	c.openByFailure("open half", half)
	c.advance(brCooldown)
	c.eval("probe", alone(half))
	open := breakerSpec(tenant, "open")
	open.ConsecutiveFailures = 1
	c.openByFailure("open", open)
	closed := breakerSpec(tenant, "closed")
	closed.ConsecutiveFailures = 3
	c.report("one failure", closed, true, false)
	ident := identical(breakerSpec(tenant, "ident"), "fp", 2)
	c.eval("ident 1", alone(ident))
	c.eval("ident 2", alone(ident))
	now := c.storeNow()

	list := func() map[string]limit.BreakerInfo {
		c.t.Helper()
		got := map[string]limit.BreakerInfo{}
		err := c.gs().ListBreakers(c.ctx, func(b limit.BreakerInfo) error {
			if strings.HasPrefix(b.Tenant, tenant) {
				if _, dup := got[b.Key]; dup {
					c.t.Errorf("breaker %q listed twice", b.Key)
				}
				got[b.Key] = b
			}
			return nil
		})
		if err != nil {
			c.t.Fatalf("ListBreakers: %v", err)
		}
		return got
	}
	got := list()
	want := map[string]limit.BreakerInfo{
		half.Key:  {Key: half.Key, Tenant: tenant, Subject: "half", ID: "subject:half", Reason: limit.ReasonFailures, HalfOpen: true, Until: now.Add(brLease), Cooldown: brCooldown, Failures: 1},
		open.Key:  {Key: open.Key, Tenant: tenant, Subject: "open", ID: "subject:open", Reason: limit.ReasonFailures, Until: now.Add(brCooldown), Cooldown: brCooldown, Failures: 1},
		ident.Key: {Key: ident.Key, Tenant: tenant, Subject: "ident", ID: "subject:ident", Reason: limit.ReasonIdentical, Until: now.Add(brCooldown), Cooldown: brCooldown, Identical: 2},
	}
	if len(got) != len(want) {
		c.t.Errorf("listed %d breakers, want %d: %+v", len(got), len(want), got)
	}
	slack := time.Duration(0)
	if c.h.RealTime || c.h.Now == nil {
		slack = 2 * time.Second
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			c.t.Errorf("breaker %q not listed", k)
			continue
		}
		if d := g.Until.Sub(w.Until); d < -slack || d > slack {
			c.t.Errorf("breaker %q: Until %v, want %v (within %v)", k, g.Until, w.Until, slack)
		}
		g.Until = w.Until
		if g != w {
			c.t.Errorf("breaker %q listed as\n %+v\nwant\n %+v", k, g, w)
		}
	}
	stop := errors.New("stop")
	calls := 0
	err := c.gs().ListBreakers(c.ctx, func(limit.BreakerInfo) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		c.t.Errorf("ListBreakers with fn failing: %v after %d calls, want the error of fn after 1", err, calls)
	}

	reset := func(key string, want bool) {
		c.t.Helper()
		ok, err := c.gs().ResetBreaker(c.ctx, key)
		if err != nil || ok != want {
			c.t.Errorf("ResetBreaker(%q) = %v, %v; want %v", key, ok, err, want)
		}
	}
	reset(open.Key, true)
	reset(open.Key, false)
	reset(closed.Key, true)
	reset(ident.Key, true)
	reset(breakerSpec(tenant, "never").Key, false)
	_, err = c.gs().ResetBreaker(c.ctx, "")
	c.expectErr("ResetBreaker of an empty key", err, limit.ErrInvalidBreaker)
	got = list()
	if _, ok := got[half.Key]; len(got) != 1 || !ok {
		c.t.Errorf("after the resets, listed %+v; want the half-open breaker only", got)
	}
	c.expectBreaker("reset breaker", c.eval("after reset", alone(open)).Breaker, brWant{})
	c.expectBreaker("reset breaker's failures", c.report("failure", closed, true, false), brWant{failures: 1})
	// The reset cleared the count of the identical calls that opened it.
	c.expectBreaker("identical call after the reset", c.eval("after reset", alone(ident)).Breaker, brWant{identical: 1})
}

// testBreakerTTL: every breaker key has a TTL: an open breaker lives
// MaxCooldown past its cooldown (a half-open one past its probe's lease), a
// closed one with counts MaxCooldown past its last change, an identical
// counter to the end of its window; a closed breaker without counts is not
// held. On an exact clock every key is gone once past its TTL.
func testBreakerTTL(c *tcase) {
	tenant := "br-ttl-" + c.id
	open := breakerSpec(tenant, "open")
	open.ConsecutiveFailures = 1
	half := breakerSpec(tenant, "half")
	half.ConsecutiveFailures = 1
	counts := breakerSpec(tenant, "counts")
	counts.ConsecutiveFailures = 3
	none := identical(breakerSpec(tenant, "none"), "fp", 3)

	c.openByFailure("open half", half)
	c.advance(brCooldown)
	c.eval("probe", alone(half))
	c.openByFailure("open", open)
	c.report("one failure", counts, true, false)
	c.eval("counted call", alone(none))
	want := map[string]time.Duration{
		open.Key:          brCooldown + brMax,
		half.Key:          brLease + brMax,
		counts.Key:        brMax,
		none.IdenticalKey: brWithin,
	}
	slack := time.Duration(0)
	if c.h.RealTime {
		slack = 2 * time.Second
	}
	ttls := c.tenantTTLs(tenant)
	for k, ttl := range ttls {
		w, ok := want[k]
		switch {
		case !ok:
			c.t.Errorf("unexpected key %q (TTL %v)", k, ttl)
		case ttl < w-slack || ttl > w:
			c.t.Errorf("key %q: TTL %v, want %v (minus at most %v)", k, ttl, w, slack)
		}
	}
	for k := range want {
		if _, ok := ttls[k]; !ok {
			c.t.Errorf("key %q not held", k)
		}
	}
	if c.h.RealTime {
		return // the server expires keys on its own clock, which Advance does not move
	}
	c.advance(brMax)
	if _, ok := c.tenantTTLs(tenant)[counts.Key]; ok {
		c.t.Error("a closed breaker's counts outlived MaxCooldown")
	}
	c.expectBreaker("after its counts expired", c.report("failure", counts, true, false), brWant{failures: 1})
	c.advance(brWithin)
	if ttls := c.tenantTTLs(tenant); len(ttls) != 0 {
		c.t.Errorf("after every TTL: keys %v still held", ttls)
	}
}
