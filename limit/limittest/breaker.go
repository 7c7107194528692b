package limittest

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// The breaker scenarios hold a limit.GuardedStore to limit/breaker.go and
// limit/internal/algo/breaker.go: each trigger opens the breaker after
// exactly its count, an open breaker charges nothing, exactly one probe
// goes through a half-open breaker, failed probes back off, every key has
// its TTL, and Evaluate without a breaker is Take or TakeMetered. Each
// scenario works on tenants of its own, so they run in parallel on one
// shared server.

var breakerScenarios = []scenario{
	{name: "denials", run: testBreakerDenials},
	{name: "failures", run: testBreakerFailures},
	{name: "identical", run: testBreakerIdentical},
	{name: "identical_window", run: testBreakerIdenticalWindow},
	{name: "concurrent_triggers", run: testBreakerConcurrentTriggers},
	{name: "half_open", run: testBreakerHalfOpen},
	{name: "backoff", run: testBreakerBackoff},
	{name: "probe_lease", run: testBreakerProbeLease},
	{name: "release_probe", run: testBreakerReleaseProbe},
	{name: "add_denials", run: testBreakerAddDenials},
	{name: "list_reset", run: testBreakerListReset},
	{name: "ttl", run: testBreakerTTL},
	{name: "hostile_tenants", run: testBreakerHostileTenants},
	{name: "same_as_take", run: testBreakerSameAsTake},
	{name: "invalid", run: testBreakerInvalid},
	{name: "model", run: testBreakerModel},
	{name: "noscript", scripts: true, run: testBreakerNoScript},
}

func runBreakerScenarios(t *testing.T, newHarness func(t *testing.T) Harness, scripts bool) {
	t.Run("breaker", func(t *testing.T) {
		for _, sc := range breakerScenarios {
			if sc.scripts && !scripts {
				continue
			}
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				sc.run(newCase(t, newHarness(t), limit.FixedWindow))
			})
		}
	})
}

// The scenarios' breaker durations: whole ticks of the model (tick), so the
// model can use them too.
const (
	brCooldown = time.Minute
	brMax      = 4 * time.Minute
	brLease    = 30 * time.Second
	brWithin   = 10 * time.Minute
)

func (c *tcase) gs() limit.GuardedStore { return c.h.Store.(limit.GuardedStore) }

// breakerSpec returns a breaker of tenant named by id, with no trigger set.
func breakerSpec(tenant, id string) limit.BreakerSpec {
	return limit.BreakerSpec{
		Key:         keyspace.Breaker(tenant, "subject:"+id),
		Tenant:      tenant,
		Subject:     id,
		ID:          "subject:" + id,
		Cooldown:    brCooldown,
		MaxCooldown: brMax,
		ProbeLease:  brLease,
	}
}

// identical sets sp's identical-calls trigger for the fingerprint fp.
func identical(sp limit.BreakerSpec, fp string, count int64) limit.BreakerSpec {
	sp.IdenticalKey = keyspace.BreakerCall(sp.Tenant, sp.ID, fp)
	sp.IdenticalCount = count
	sp.IdenticalWithin = brWithin
	return sp
}

// alone is a request guarded by the breaker sp alone (no checks, no meter).
func alone(sp limit.BreakerSpec) limit.Request {
	return limit.Request{Breaker: &sp, Cost: 1}
}

// guarded is a request of the checks, with the meter (nil: none) and the
// breaker sp.
func guarded(sp limit.BreakerSpec, m *limit.Meter, checks ...limit.Check) limit.Request {
	return limit.Request{Checks: checks, Meter: m, Breaker: &sp, Cost: 1}
}

// eval runs Evaluate, fails the test on an error, and checks the shape
// every outcome has.
func (c *tcase) eval(label string, req limit.Request) limit.Outcome {
	c.t.Helper()
	o, err := c.gs().Evaluate(c.ctx, req)
	if err != nil {
		c.t.Fatalf("%s: Evaluate: %v", label, err)
	}
	c.outcomeShape(label, req, o)
	return o
}

func (c *tcase) outcomeShape(label string, req limit.Request, o limit.Outcome) {
	c.t.Helper()
	d, b := o.Decision, o.Breaker
	if len(d.Results) != len(req.Checks) || d.Results == nil {
		c.t.Errorf("%s: %d results (nil %v) for %d checks", label, len(d.Results), d.Results == nil, len(req.Checks))
		return
	}
	if req.Breaker == nil {
		if b != (limit.BreakerState{}) {
			c.t.Errorf("%s: breaker state %+v without a breaker", label, b)
		}
		return
	}
	switch {
	case b.Open && (d.Allowed || d.Rule.Name != "" || d.Lease != "" || b.Opened || b.Probe || b.RetryAfter <= 0 || o.Meter != (limit.MeterResult{})):
		c.t.Errorf("%s: open breaker with %+v: want denied, zero Rule and meter, no lease, a positive RetryAfter", label, o)
	case b.Open:
		for i, r := range d.Results {
			if r != (limit.Result{}) {
				c.t.Errorf("%s: open breaker with result %d %+v, want zero", label, i, r)
			}
		}
	case b.Probe && !d.Allowed:
		c.t.Errorf("%s: a denied call reported as the probe: %+v", label, o)
	case b.Opened && (b.Reason == "" || b.RetryAfter != b.Cooldown):
		c.t.Errorf("%s: opened with %+v: want a reason and RetryAfter = Cooldown", label, b)
	case !b.Opened && b.RetryAfter != 0:
		c.t.Errorf("%s: RetryAfter %v on an evaluated call that did not open the breaker", label, b.RetryAfter)
	}
	if b.Cooldown <= 0 {
		c.t.Errorf("%s: cooldown %v", label, b.Cooldown)
	}
}

func (c *tcase) report(label string, sp limit.BreakerSpec, failed, probe bool) limit.BreakerState {
	c.t.Helper()
	st, err := c.gs().ReportOutcome(c.ctx, sp, failed, probe)
	if err != nil {
		c.t.Fatalf("%s: ReportOutcome: %v", label, err)
	}
	if st.Probe || st.Open != (st.RetryAfter > 0) || st.Opened && !st.Open {
		c.t.Errorf("%s: ReportOutcome gave %+v", label, st)
	}
	return st
}

func (c *tcase) addDenials(label string, sp limit.BreakerSpec, n int64) limit.BreakerState {
	c.t.Helper()
	st, err := c.gs().AddDenials(c.ctx, sp, n)
	if err != nil {
		c.t.Fatalf("%s: AddDenials: %v", label, err)
	}
	if st.Probe || st.Open != (st.RetryAfter > 0) || st.Opened && !st.Open {
		c.t.Errorf("%s: AddDenials gave %+v", label, st)
	}
	return st
}

// brWant is what a breaker state must show; retry anyDuration is not
// checked.
type brWant struct {
	open, opened, probe, halfOpen bool
	reason                        string
	denials, failures, identical  int64
	cooldown, retry               time.Duration
}

func (c *tcase) expectBreaker(label string, got limit.BreakerState, w brWant) {
	c.t.Helper()
	if w.cooldown == 0 {
		w.cooldown = brCooldown
	}
	if got.Open != w.open || got.Opened != w.opened || got.Probe != w.probe || got.HalfOpen != w.halfOpen || got.Reason != w.reason ||
		got.Denials != w.denials || got.Failures != w.failures || got.Identical != w.identical || got.Cooldown != w.cooldown {
		c.t.Errorf("%s: breaker %+v, want %+v", label, got, w)
		return
	}
	c.near(label+": RetryAfter", got.RetryAfter, w.retry)
}

// open opens sp (which must have ConsecutiveFailures 1) by a failed report.
func (c *tcase) openByFailure(label string, sp limit.BreakerSpec) {
	c.t.Helper()
	if st := c.report(label, sp, true, false); !st.Opened {
		c.t.Fatalf("%s: a failure did not open the breaker: %+v", label, st)
	}
}

// testBreakerDenials: the ConsecutiveDenials-th denial in a row opens the
// breaker, whether the checks or the quota denied; an admission starts the
// count again; an open breaker charges nothing.
func testBreakerDenials(c *tcase) {
	c.align()
	tenant := "br-den-" + c.id
	r := ruleFor(limit.FixedWindow, "den", 100)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 1)
	sp := breakerSpec(tenant, "quota")
	sp.ConsecutiveDenials = 3

	// The quota admits one call, then denies.
	req := guarded(sp, &m, ch)
	c.expectBreaker("admitted", c.eval("admitted", req).Breaker, brWant{})
	for k := int64(1); k <= 2; k++ {
		o := c.eval("quota denial", req)
		if o.Decision.Allowed || o.Meter.Allowed {
			c.t.Fatalf("quota denial %d: %+v", k, o)
		}
		c.expectBreaker(fmt.Sprintf("quota denial %d", k), o.Breaker, brWant{denials: k})
	}
	o := c.eval("third denial", req)
	if o.Decision.Allowed || o.Meter.Allowed || o.Decision.Rule.Name != "" {
		c.t.Errorf("third denial: %+v, want the quota's denial", o)
	}
	c.expectBreaker("third denial", o.Breaker, brWant{opened: true, reason: limit.ReasonDenials, denials: 3, retry: brCooldown})
	for k := range 3 {
		o := c.eval("open", req)
		c.expectBreaker(fmt.Sprintf("call %d while open", k), o.Breaker, brWant{open: true, reason: limit.ReasonDenials, denials: 3, retry: brCooldown})
		o = c.eval("open, alone", alone(sp))
		c.expectBreaker(fmt.Sprintf("call %d of the breaker alone while open", k), o.Breaker, brWant{open: true, reason: limit.ReasonDenials, denials: 3, retry: brCooldown})
	}
	// Nothing was charged but the first call.
	c.expectUsage("meter after the open breaker's denials", c.read(m.Key).Live, use(1, 0, 1, 0))
	c.expect("check after the open breaker's denials", c.take(1, ch), r, want2(100-1-1))

	// Denials by the checks; an admission in between starts the count again.
	r1 := ruleFor(limit.FixedWindow, "den-1", 1)
	ch1 := tenantCheck(tenant, r1)
	sp2 := breakerSpec(tenant, "checks")
	sp2.ConsecutiveDenials = 3
	c.eval("exhaust", guarded(sp2, nil, ch1))
	deny := guarded(sp2, nil, ch1)
	for k := int64(1); k <= 2; k++ {
		o := c.eval("check denial", deny)
		if o.Decision.Allowed || o.Decision.Rule != r1 {
			c.t.Fatalf("check denial %d: %+v, want denied by %s", k, o.Decision, r1.Name)
		}
		c.expectBreaker(fmt.Sprintf("check denial %d", k), o.Breaker, brWant{denials: k})
	}
	c.expectBreaker("admission", c.eval("admission", alone(sp2)).Breaker, brWant{})
	for k := int64(1); k <= 2; k++ {
		c.expectBreaker(fmt.Sprintf("check denial %d after the admission", k), c.eval("check denial", deny).Breaker, brWant{denials: k})
	}
	o = c.eval("third check denial", deny)
	if o.Decision.Rule != r1 {
		c.t.Errorf("third check denial decided by %+v, want %s", o.Decision.Rule, r1.Name)
	}
	c.expectBreaker("third check denial", o.Breaker, brWant{opened: true, reason: limit.ReasonDenials, denials: 3, retry: brCooldown})
	c.expectBreaker("after the third check denial", c.eval("open", alone(sp2)).Breaker, brWant{open: true, reason: limit.ReasonDenials, denials: 3, retry: brCooldown})

	// A meter that needs its Seed is no denial.
	sp3 := breakerSpec(tenant, "seed")
	sp3.ConsecutiveDenials = 1
	unseeded := c.meter(tenant, 0)
	unseeded.Key, unseeded.Period, unseeded.Seeded = keyspace.Usage(tenant, "unseeded"), "unseeded", false
	o = c.eval("unseeded meter", guarded(sp3, &unseeded, ch))
	if o.Decision.Allowed || !o.Meter.NeedSeed {
		c.t.Errorf("unseeded meter: %+v, want NeedSeed", o)
	}
	c.expectBreaker("unseeded meter", o.Breaker, brWant{})
}

// testBreakerFailures: the ConsecutiveFailures-th failed report in a row
// opens the breaker; a success starts the count again; a report on an open
// breaker only counts.
func testBreakerFailures(c *tcase) {
	tenant := "br-fail-" + c.id
	sp := breakerSpec(tenant, "f")
	sp.ConsecutiveFailures = 3
	c.expectBreaker("admitted", c.eval("admitted", alone(sp)).Breaker, brWant{})
	for k := int64(1); k <= 2; k++ {
		c.expectBreaker(fmt.Sprintf("failure %d", k), c.report("failure", sp, true, false), brWant{failures: k})
	}
	c.expectBreaker("success", c.report("success", sp, false, false), brWant{})
	for k := int64(1); k <= 2; k++ {
		c.expectBreaker(fmt.Sprintf("failure %d after the success", k), c.report("failure", sp, true, false), brWant{failures: k})
	}
	c.expectBreaker("third failure", c.report("third failure", sp, true, false),
		brWant{open: true, opened: true, reason: limit.ReasonFailures, failures: 3, retry: brCooldown})
	c.expectBreaker("call while open", c.eval("open", alone(sp)).Breaker,
		brWant{open: true, reason: limit.ReasonFailures, failures: 3, retry: brCooldown})
	// A late report of a call admitted before the breaker opened.
	c.expectBreaker("failure while open", c.report("late failure", sp, true, false),
		brWant{open: true, reason: limit.ReasonFailures, failures: 4, retry: brCooldown})
	c.expectBreaker("success while open", c.report("late success", sp, false, false),
		brWant{open: true, reason: limit.ReasonFailures, retry: brCooldown})
}

// testBreakerIdentical: the IdenticalCount-th admitted call of one
// fingerprint opens the breaker and goes through; the next is denied and
// charges nothing. Other fingerprints count apart; denied calls do not
// count.
func testBreakerIdentical(c *tcase) {
	c.align()
	tenant := "br-ident-" + c.id
	r := ruleFor(limit.FixedWindow, "ident", 100)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 0)
	sp := identical(breakerSpec(tenant, "i"), "fp-a", 3)
	req := guarded(sp, &m, ch)
	for k := int64(1); k <= 2; k++ {
		o := c.eval("identical call", req)
		if !o.Decision.Allowed {
			c.t.Fatalf("identical call %d denied: %+v", k, o)
		}
		c.expectBreaker(fmt.Sprintf("identical call %d", k), o.Breaker, brWant{identical: k})
	}
	o := c.eval("third identical call", req)
	if !o.Decision.Allowed || !o.Meter.Allowed {
		c.t.Errorf("third identical call: %+v, want admitted (the upstream sees exactly 3)", o)
	}
	c.expectBreaker("third identical call", o.Breaker, brWant{opened: true, reason: limit.ReasonIdentical, identical: 3, retry: brCooldown})
	o = c.eval("fourth identical call", req)
	c.expectBreaker("fourth identical call", o.Breaker, brWant{open: true, reason: limit.ReasonIdentical, identical: 3, retry: brCooldown})
	other := identical(sp, "fp-b", 3)
	c.expectBreaker("another fingerprint while open", c.eval("other", guarded(other, &m, ch)).Breaker,
		brWant{open: true, reason: limit.ReasonIdentical, identical: 3, retry: brCooldown})
	c.expectUsage("meter after the open breaker's denials", c.read(m.Key).Live, use(3, 0, 3, 0))
	c.expect("check after the open breaker's denials", c.take(1, ch), r, want2(100-3-1))

	// Two fingerprints of one breaker count apart.
	sp2 := breakerSpec(tenant, "two")
	a, b := identical(sp2, "fp-a", 3), identical(sp2, "fp-b", 3)
	for k, w := range []struct {
		sp    limit.BreakerSpec
		count int64
	}{{a, 1}, {b, 1}, {a, 2}, {b, 2}} {
		c.expectBreaker(fmt.Sprintf("call %d of two fingerprints", k), c.eval("two", alone(w.sp)).Breaker, brWant{identical: w.count})
	}
	// A denied identical call does not count.
	r1 := ruleFor(limit.FixedWindow, "ident-1", 1)
	ch1 := tenantCheck(tenant, r1)
	c.take(1, ch1)
	o = c.eval("denied identical call", guarded(a, nil, ch1))
	if o.Decision.Allowed {
		c.t.Fatalf("denied identical call admitted: %+v", o)
	}
	c.expectBreaker("denied identical call", o.Breaker, brWant{denials: 1})
	c.expectBreaker("third call of fp-a", c.eval("third a", alone(a)).Breaker,
		brWant{opened: true, reason: limit.ReasonIdentical, identical: 3, retry: brCooldown})
}

// testBreakerIdenticalWindow: the identical-calls window starts at the
// fingerprint's first counted call and is not moved by later calls.
func testBreakerIdenticalWindow(c *tcase) {
	tenant := "br-window-" + c.id
	a := identical(breakerSpec(tenant, "a"), "fp", 3)
	b := identical(breakerSpec(tenant, "b"), "fp", 3)
	c.eval("a 1", alone(a))
	c.eval("b 1", alone(b))
	c.advance(6 * time.Minute)
	c.expectBreaker("a 2", c.eval("a 2", alone(a)).Breaker, brWant{identical: 2})
	c.expectBreaker("b 2", c.eval("b 2", alone(b)).Breaker, brWant{identical: 2})
	c.advance(brWithin - 6*time.Minute - c.step())
	c.expectBreaker("a 3, just inside the window", c.eval("a 3", alone(a)).Breaker,
		brWant{opened: true, reason: limit.ReasonIdentical, identical: 3, retry: brCooldown})
	c.advance(c.step())
	c.expectBreaker("b 3, the window of its first call ended", c.eval("b 3", alone(b)).Breaker, brWant{identical: 1})
}

// testBreakerConcurrentTriggers: 64 concurrent callers open a breaker
// exactly once, after exactly the threshold.
func testBreakerConcurrentTriggers(c *tcase) {
	c.align()
	const workers = 64
	tenant := "br-conc-" + c.id
	hammer := func(req limit.Request) []limit.Outcome {
		var mu sync.Mutex
		var out []limit.Outcome
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range 2 {
					o, err := c.gs().Evaluate(c.ctx, req)
					if err != nil {
						c.t.Errorf("Evaluate: %v", err)
						return
					}
					mu.Lock()
					out = append(out, o)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return out
	}
	count := func(label string, outs []limit.Outcome, threshold int64, counter func(limit.BreakerState) int64) {
		c.t.Helper()
		var seen []int64
		opened, admitted := 0, 0
		for _, o := range outs {
			if o.Decision.Allowed {
				admitted++
			}
			if o.Breaker.Opened {
				opened++
			}
			if !o.Breaker.Open {
				seen = append(seen, counter(o.Breaker))
			}
		}
		sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
		want := make([]int64, threshold)
		for i := range want {
			want[i] = int64(i + 1)
		}
		if opened != 1 || fmt.Sprint(seen) != fmt.Sprint(want) {
			c.t.Errorf("%s: %d calls opened the breaker, counts %v; want 1, counts %v", label, opened, seen, want)
		}
		c.t.Logf("%s: %d admitted of %d", label, admitted, len(outs))
	}

	r1 := ruleFor(limit.FixedWindow, "conc-1", 1)
	ch1 := tenantCheck(tenant, r1)
	c.take(1, ch1)
	den := breakerSpec(tenant, "den")
	den.ConsecutiveDenials = 10
	count("denials", hammer(guarded(den, nil, ch1)), 10, func(b limit.BreakerState) int64 { return b.Denials })

	r := ruleFor(limit.FixedWindow, "conc", 1000)
	ch := tenantCheck(tenant, r)
	id := identical(breakerSpec(tenant, "ident"), "fp", 5)
	outs := hammer(guarded(id, nil, ch))
	count("identical", outs, 5, func(b limit.BreakerState) int64 { return b.Identical })
	admitted := 0
	for _, o := range outs {
		if o.Decision.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		c.t.Errorf("identical: %d admitted, want exactly 5", admitted)
	}
	c.expect("check after the identical calls", c.take(1, ch), r, want2(1000-5-1))
}
