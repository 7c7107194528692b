package limittest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// The layered scenarios hold a limit.GuardedStore's Evaluate with global
// checks (limit.Request.Global) to limit/breaker.go: tenant checks, global
// checks, the meter and the breaker are decided all-or-nothing, a global
// denial charges nothing and counts for the breaker, admissions are exact
// under contention, and concurrency leases of global rules are released
// like the tenant's. Global counters are shared by every tenant, so each
// scenario names its global rules with its own id.

var layeredScenarios = []scenario{
	{name: "all_or_nothing", run: testLayeredAllOrNothing},
	{name: "global_denial_charges_nothing", run: testLayeredGlobalDenial},
	{name: "exact_global", run: testLayeredExactGlobal},
	{name: "exact_tenant", run: testLayeredExactTenant},
	{name: "exact_quota", run: testLayeredExactQuota},
	{name: "breaker", run: testLayeredBreaker},
	{name: "leases", run: testLayeredLeases},
	{name: "invalid", run: testLayeredInvalid},
	{name: "model", run: testLayeredModel},
}

func runLayeredScenarios(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("layered", func(t *testing.T) {
		for _, sc := range layeredScenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				sc.run(newCase(t, newHarness(t), limit.FixedWindow))
			})
		}
	})
}

// global is the check of r as a global rule (keyspace.PerGlobal): one
// counter for every tenant, in the global slot.
func (c *tcase) global(r limit.Rule) limit.Check {
	return limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerGlobal, r.Name, c.owner)}
}

// layeredShape checks what every outcome of a layered request has, on top
// of outcomeShape.
func (c *tcase) layeredShape(label string, req limit.Request, o limit.Outcome) {
	c.t.Helper()
	c.outcomeShape(label, req, o)
	if len(o.Global.Results) != len(req.Global) {
		c.t.Errorf("%s: %d global results for %d global checks", label, len(o.Global.Results), len(req.Global))
	}
	if o.Global.Lease != "" {
		c.t.Errorf("%s: the global decision carries lease %q (Decision.Lease names the request's slots)", label, o.Global.Lease)
	}
	if o.GlobalDecides {
		found := false
		for _, g := range req.Global {
			found = found || g.Rule == o.Decision.Rule
		}
		if !found {
			c.t.Errorf("%s: GlobalDecides with rule %q, not a global rule", label, o.Decision.Rule.Name)
		}
	}
	if o.Decision.Allowed && len(req.Global) > 0 && !o.Global.Allowed {
		c.t.Errorf("%s: admitted while the global rules denied", label)
	}
}

// layered runs Evaluate on a layered request and checks its shape.
func (c *tcase) layered(label string, req limit.Request) limit.Outcome {
	c.t.Helper()
	o, err := c.gs().Evaluate(c.ctx, req)
	if err != nil {
		c.t.Fatalf("%s: Evaluate: %v", label, err)
	}
	c.layeredShape(label, req, o)
	return o
}

// remaining reads, through a denied probe of cost capacity+1, what a
// counter has left without charging it (a concurrency counter, which
// counts calls, through a slot taken and released at once).
func (c *tcase) remaining(ch limit.Check) int64 {
	c.t.Helper()
	if ch.Rule.Algorithm == limit.Concurrency {
		d := c.take(1, ch)
		if !d.Allowed {
			return 0
		}
		c.release(d.Lease, ch)
		return d.Results[0].Remaining + 1
	}
	d := c.take(ch.Rule.Capacity()+1, ch)
	if d.Allowed {
		c.t.Fatalf("a probe of cost %d was admitted by %s", ch.Rule.Capacity()+1, ch.Rule.Name)
	}
	return d.Results[0].Remaining
}

// testLayeredAllOrNothing: a global denial charges no tenant counter, a
// tenant denial charges no global counter; the deciding rule is the
// denying one (GlobalDecides says which side), and an admitted call
// reports the most restrictive rule of both sides.
func testLayeredAllOrNothing(c *tcase) {
	c.align()
	tr := c.rule("tenant", 5)
	gr := c.rule("global-"+c.id, 3)
	tc, gc := c.check(keyspace.PerTenant, tr), c.global(gr)
	req := limit.Request{Checks: []limit.Check{tc}, Global: []limit.Check{gc}, Cost: 1}
	for i := range 3 {
		o := c.layered(fmt.Sprintf("call %d", i+1), req)
		if !o.Decision.Allowed || !o.Global.Allowed {
			c.t.Fatalf("call %d: %+v, want admitted", i+1, o)
		}
		// global has 3-i-1 left, tenant 5-i-1: the global rule is the most restrictive
		if o.Decision.Rule != gr || !o.GlobalDecides || o.Decision.Remaining != int64(2-i) {
			c.t.Errorf("call %d: decided by %q (global %v) with %d left, want the global rule with %d", i+1, o.Decision.Rule.Name, o.GlobalDecides, o.Decision.Remaining, 2-i)
		}
		if o.Decision.Results[0].Remaining != int64(4-i) || o.Global.Results[0].Remaining != int64(2-i) {
			c.t.Errorf("call %d: results tenant %+v global %+v", i+1, o.Decision.Results[0], o.Global.Results[0])
		}
	}
	o := c.layered("call 4", req)
	if o.Decision.Allowed || o.Global.Allowed || !o.GlobalDecides || o.Decision.Rule != gr || o.Decision.RetryAfter <= 0 {
		c.t.Fatalf("call 4: %+v, want denied by the global rule", o)
	}
	if !o.Decision.Results[0].Allowed || o.Decision.Results[0].Remaining != 1 {
		c.t.Errorf("call 4: tenant result %+v, want allowed with 1 left (what it would have left)", o.Decision.Results[0])
	}
	if got := c.remaining(tc); got != 2 {
		t := c.t
		t.Errorf("after a global denial the tenant counter has %d left, want 2 (not charged)", got)
	}

	// A tenant denial charges no global counter.
	c2 := *c
	c2.owner.Tenant = "other-" + c.id
	tr2 := c.rule("tenant-small", 1)
	gr2 := c.rule("global2-"+c.id, 10)
	tc2, gc2 := c2.check(keyspace.PerTenant, tr2), c.global(gr2)
	req2 := limit.Request{Checks: []limit.Check{tc2}, Global: []limit.Check{gc2}, Cost: 1}
	if o := c.layered("small tenant 1", req2); !o.Decision.Allowed || o.GlobalDecides || o.Decision.Rule != tr2 {
		c.t.Fatalf("small tenant 1: %+v, want admitted, decided by the tenant rule (0 left)", o)
	}
	for i := range 3 {
		o := c.layered("small tenant denied", req2)
		if o.Decision.Allowed || o.GlobalDecides || o.Decision.Rule != tr2 || !o.Global.Allowed {
			c.t.Fatalf("small tenant denial %d: %+v, want denied by the tenant rule, the global rule allowing", i+1, o)
		}
	}
	if got := c.remaining(gc2); got != 9 {
		c.t.Errorf("after tenant denials the global counter has %d left, want 9 (charged once)", got)
	}
}

// testLayeredGlobalDenial: with a meter and a breaker, a global denial
// charges nothing: no tenant counter, no meter, no concurrency slot.
func testLayeredGlobalDenial(c *tcase) {
	c.align()
	tenant := c.owner.Tenant
	m := c.meter(tenant, 100)
	sp := breakerSpec(tenant, "g-"+c.id)
	sp.ConsecutiveDenials = 100
	tr := c.rule("tenant", 10)
	cr := ruleFor(limit.Concurrency, "slots", 10)
	gr := c.rule("global-"+c.id, 1)
	tc, cc, gc := c.check(keyspace.PerTenant, tr), c.check(keyspace.PerTenantTool, cr), c.global(gr)
	req := limit.Request{Checks: []limit.Check{tc, cc}, Global: []limit.Check{gc}, Meter: &m, Breaker: &sp, Cost: 1}
	o := c.layered("first", req)
	if !o.Decision.Allowed || o.Decision.Lease == "" || o.Meter.Usage.Calls != 1 {
		c.t.Fatalf("first: %+v, want admitted with a lease and one call metered", o)
	}
	for i := range 3 {
		o := c.layered("denied", req)
		if o.Decision.Allowed || !o.GlobalDecides || o.Decision.Lease != "" {
			c.t.Fatalf("denial %d: %+v, want denied by the global rule, no lease", i+1, o)
		}
		if !o.Meter.Allowed {
			c.t.Errorf("denial %d: meter %+v, want the quota admitting", i+1, o.Meter)
		}
	}
	if got := c.remaining(tc); got != 9 {
		c.t.Errorf("tenant counter has %d left, want 9 (one admission)", got)
	}
	if got := c.remaining(cc); got != 9 {
		c.t.Errorf("concurrency counter has %d slots left, want 9 (one admission)", got)
	}
	st := c.read(m.Key)
	if st.Live.Used() != 1 || st.Live.NetCalls() != 1 {
		c.t.Errorf("meter %+v after one admission and 3 global denials, want 1 used in 1 call", st.Live)
	}
}

// testLayeredExactGlobal: N callers of N tenants, a global limit L (each
// tenant's own rule never binds): exactly L admitted, and the global
// counter holds exactly L.
func testLayeredExactGlobal(c *tcase) {
	c.align()
	const callers, perCaller, L = 16, 4, 21
	gr := c.rule("global-"+c.id, L)
	gc := c.global(gr)
	tr := c.rule("tenant", 100)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			c2 := *c
			c2.owner.Tenant = fmt.Sprintf("t%d-%s", i, c.id)
			req := limit.Request{Checks: []limit.Check{c2.check(keyspace.PerTenant, tr)}, Global: []limit.Check{gc}, Cost: 1}
			for range perCaller {
				o, err := c.gs().Evaluate(c.ctx, req)
				if err != nil {
					c.t.Errorf("Evaluate: %v", err)
					return
				}
				if o.Decision.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != L {
		c.t.Errorf("%d callers x %d calls under a global limit of %d: %d admitted", callers, perCaller, L, n)
	}
	if got := c.remaining(gc); got != 0 {
		c.t.Errorf("global counter has %d left, want 0", got)
	}
}

// testLayeredExactTenant: N callers of one tenant whose rule (L) binds
// before the global one: exactly L admitted, and the global counter is
// charged exactly L times (denied calls gave back what they took).
func testLayeredExactTenant(c *tcase) {
	c.align()
	const callers, perCaller, L, G = 16, 4, 13, 40
	tr := c.rule("tenant", L)
	gr := c.rule("global-"+c.id, G)
	tc, gc := c.check(keyspace.PerTenant, tr), c.global(gr)
	req := limit.Request{Checks: []limit.Check{tc}, Global: []limit.Check{gc}, Cost: 1}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range perCaller {
				o, err := c.gs().Evaluate(c.ctx, req)
				if err != nil {
					c.t.Errorf("Evaluate: %v", err)
					return
				}
				if o.Decision.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != L {
		c.t.Errorf("%d callers x %d calls under a tenant limit of %d: %d admitted", callers, perCaller, L, n)
	}
	if got := c.remaining(gc); got != G-L {
		c.t.Errorf("global counter has %d left, want %d (charged once per admission)", got, G-L)
	}
}

// testLayeredExactQuota: N callers of one tenant with a quota Q below the
// global limit: exactly Q admitted and metered, the global counter charged
// exactly Q times.
func testLayeredExactQuota(c *tcase) {
	c.align()
	const callers, perCaller, Q, G = 16, 4, 11, 40
	m := c.meter(c.owner.Tenant, Q)
	gr := c.rule("global-"+c.id, G)
	gc := c.global(gr)
	req := limit.Request{Global: []limit.Check{gc}, Meter: &m, Cost: 1}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range perCaller {
				o, err := c.gs().Evaluate(c.ctx, req)
				if err != nil {
					c.t.Errorf("Evaluate: %v", err)
					return
				}
				if o.Decision.Allowed {
					admitted.Add(1)
				} else if o.Decision.Rule.Name != "" || o.GlobalDecides {
					c.t.Errorf("a quota denial decided by rule %q (global %v), want the zero Rule", o.Decision.Rule.Name, o.GlobalDecides)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != Q {
		c.t.Errorf("%d callers x %d calls under a quota of %d: %d admitted", callers, perCaller, Q, n)
	}
	if st := c.read(m.Key); st.Live.Used() != Q || st.Live.NetCalls() != Q {
		c.t.Errorf("meter %+v, want %d used in %d calls", st.Live, Q, Q)
	}
	if got := c.remaining(gc); got != G-Q {
		c.t.Errorf("global counter has %d left, want %d", got, G-Q)
	}
}

// testLayeredBreaker: global denials count toward ConsecutiveDenials like
// tenant denials: the D-th in a row opens the breaker, which then denies
// without evaluating (or charging) anything.
func testLayeredBreaker(c *tcase) {
	c.align()
	const D = 3
	sp := breakerSpec(c.owner.Tenant, "b-"+c.id)
	sp.ConsecutiveDenials = D
	tr := c.rule("tenant", 100)
	gr := c.rule("global-"+c.id, 1)
	tc, gc := c.check(keyspace.PerTenant, tr), c.global(gr)
	req := limit.Request{Checks: []limit.Check{tc}, Global: []limit.Check{gc}, Breaker: &sp, Cost: 1}
	if o := c.layered("admitted", req); !o.Decision.Allowed || o.Breaker.Denials != 0 {
		c.t.Fatalf("first call: %+v, want admitted", o)
	}
	for i := 1; i <= D; i++ {
		o := c.layered(fmt.Sprintf("global denial %d", i), req)
		if o.Decision.Allowed || !o.GlobalDecides {
			c.t.Fatalf("denial %d: %+v, want denied by the global rule", i, o)
		}
		if o.Breaker.Denials != int64(i) || o.Breaker.Opened != (i == D) {
			c.t.Errorf("denial %d: breaker %+v, want %d denials, opened %v", i, o.Breaker, i, i == D)
		}
	}
	o := c.layered("after opening", req)
	if !o.Breaker.Open || o.Decision.Allowed {
		c.t.Fatalf("after %d global denials: %+v, want the open breaker denying", D, o)
	}
	for i, r := range o.Global.Results {
		if r != (limit.Result{}) {
			c.t.Errorf("open breaker: global result %d %+v, want zero (nothing evaluated)", i, r)
		}
	}
	if got := c.remaining(tc); got != 99 {
		c.t.Errorf("tenant counter has %d left, want 99 (one admission)", got)
	}
}

// testLayeredLeases: a global concurrency rule takes a slot under the
// request's lease; Release with the global checks frees it.
func testLayeredLeases(c *tcase) {
	c.align()
	tr := c.rule("tenant", 100)
	gr := ruleFor(limit.Concurrency, "global-slots-"+c.id, 2)
	tc, gc := c.check(keyspace.PerTenant, tr), c.global(gr)
	req := limit.Request{Checks: []limit.Check{tc}, Global: []limit.Check{gc}, Cost: 1}
	o1 := c.layered("slot 1", req)
	o2 := c.layered("slot 2", req)
	if !o1.Decision.Allowed || !o2.Decision.Allowed || o1.Decision.Lease == "" || o1.Decision.Lease == o2.Decision.Lease {
		c.t.Fatalf("two calls: %+v / %+v, want both admitted with leases of their own", o1.Decision, o2.Decision)
	}
	if o := c.layered("slot 3", req); o.Decision.Allowed || !o.GlobalDecides || o.Decision.Lease != "" {
		c.t.Fatalf("third call: %+v, want denied by the global concurrency rule", o)
	}
	c.release(o1.Decision.Lease, gc)
	if o := c.layered("after release", req); !o.Decision.Allowed {
		c.t.Fatalf("after releasing a slot: %+v, want admitted", o)
	}
	if got := c.remaining(tc); got != 97 {
		c.t.Errorf("tenant counter has %d left, want 97 (three admissions)", got)
	}
}

// testLayeredInvalid: a key in both sets is refused before anything runs;
// global checks without tenant checks are a valid request.
func testLayeredInvalid(c *tcase) {
	tc := c.check(keyspace.PerTenant, c.rule("tenant", 5))
	if _, err := c.gs().Evaluate(c.ctx, limit.Request{Checks: []limit.Check{tc}, Global: []limit.Check{tc}, Cost: 1}); err == nil {
		c.t.Error("a key both tenant and global: no error")
	} else {
		c.expectErr("key in both sets", err, limit.ErrDuplicateKey)
	}
	gc := c.global(c.rule("global-"+c.id, 5))
	if _, err := c.gs().Evaluate(c.ctx, limit.Request{Checks: []limit.Check{tc}, Global: []limit.Check{gc}, Cost: 0}); err == nil {
		c.t.Error("cost 0: no error")
	} else {
		c.expectErr("cost 0", err, limit.ErrInvalidCost)
	}
	o := c.layered("global only", limit.Request{Global: []limit.Check{gc}, Cost: 1})
	if !o.Decision.Allowed || !o.GlobalDecides || o.Decision.Rule != gc.Rule || len(o.Decision.Results) != 0 {
		c.t.Errorf("global checks alone: %+v, want admitted by the global rule, no tenant results", o)
	}
}
