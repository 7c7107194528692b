package limittest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// The meter scenarios hold a limit.MeteredStore to limit/meter.go: usage
// is charged in the same atomic step as the checks, exactly once, quotas
// are exact under contention, counters are re-created from their Seed, and
// the flushed part only ever grows. Each scenario works on meters of its own
// (tenants and periods with the subtest's random id), so they run in
// parallel on one shared server.

var meterScenarios = []scenario{
	{name: "exact_quota", run: testMeterExactQuota},
	{name: "all_or_nothing", run: testMeterAllOrNothing},
	{name: "zero_checks", run: testMeterZeroChecks},
	{name: "cost", run: testMeterCost},
	{name: "separate_cost", run: testMeterSeparateCost},
	{name: "seed", run: testMeterSeed},
	{name: "adjust", run: testMeterAdjust},
	{name: "mark_flushed", run: testMeterMarkFlushed},
	{name: "scan", run: testMeterScan},
	{name: "ttl", run: testMeterTTL},
	{name: "hostile_tenants", run: testMeterHostileTenants},
	{name: "invalid", run: testMeterInvalid},
	{name: "noscript", scripts: true, run: testMeterNoScript},
	{name: "op", run: testMeterOp},
	{name: "replay", run: testMeterReplay},
}

func runMeterScenarios(t *testing.T, newHarness func(t *testing.T) Harness, scripts bool) {
	t.Run("meter", func(t *testing.T) {
		for _, sc := range meterScenarios {
			if sc.scripts && !scripts {
				continue
			}
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				// the algorithm is the one the checks of a metered batch use
				// unless a scenario says otherwise
				sc.run(newCase(t, newHarness(t), limit.FixedWindow))
			})
		}
	})
}

// meterPeriod is the billing period of the scenarios' meters.
const meterPeriod = "2026-11"

// meterLife is how long after the store's now the scenarios' meters expire.
const meterLife = 40 * 24 * time.Hour

func (c *tcase) ms() limit.MeteredStore { return c.h.Store.(limit.MeteredStore) }

// storeNow is the store's clock (Harness.Now), or time.Now without one.
func (c *tcase) storeNow() time.Time {
	if c.h.Now != nil {
		return c.h.Now()
	}
	return time.Now()
}

// meter returns a meter of tenant for meterPeriod, with quota, Seeded with
// a zero Seed (a new period), expiring meterLife from the store's now.
func (c *tcase) meter(tenant string, quota int64) limit.Meter {
	return limit.Meter{
		Key:      keyspace.Usage(tenant, meterPeriod),
		Tenant:   tenant,
		Period:   meterPeriod,
		Quota:    quota,
		Seeded:   true,
		ExpireAt: c.storeNow().Add(meterLife).Truncate(time.Second),
	}
}

// tenantCheck is a check of rule r on tenant's own counter (its slot).
func tenantCheck(tenant string, r limit.Rule) limit.Check {
	return limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerTenant, r.Name, keyspace.Owner{Tenant: tenant})}
}

// takeM runs TakeMetered, fails the test on an error, and checks the shape
// every metered decision has.
func (c *tcase) takeM(m limit.Meter, cost int64, checks ...limit.Check) (limit.Decision, limit.MeterResult) {
	c.t.Helper()
	d, mr, err := c.ms().TakeMetered(c.ctx, checks, m, cost)
	if err != nil {
		c.t.Fatalf("TakeMetered(cost %d, %d checks, meter %q): %v", cost, len(checks), m.Key, err)
	}
	c.meterShape(d, mr, checks)
	return d, mr
}

func (c *tcase) meterShape(d limit.Decision, mr limit.MeterResult, checks []limit.Check) {
	c.t.Helper()
	if len(checks) > 0 {
		c.shape(d, checks)
	} else if d.Results == nil || len(d.Results) != 0 || d.Rule.Name != "" || d.Lease != "" {
		c.t.Errorf("metered decision without checks: %+v, want empty non-nil Results, zero Rule, no lease", d)
	}
	if mr.NeedSeed && (mr.Allowed || d.Allowed || mr.Usage != (limit.Usage{})) {
		c.t.Errorf("NeedSeed with %+v, %+v: want nothing allowed and zero usage", d, mr)
	}
	if d.Allowed && !mr.Allowed {
		c.t.Errorf("decision admitted (%+v) while the meter did not (%+v)", d, mr)
	}
}

// read returns a meter the store must hold.
func (c *tcase) read(key string) limit.MeterState {
	c.t.Helper()
	st, ok, err := c.ms().ReadMeter(c.ctx, key)
	if err != nil || !ok {
		c.t.Fatalf("ReadMeter(%q) = %v, %v; want the meter", key, ok, err)
	}
	if st.Key != key {
		c.t.Errorf("ReadMeter(%q) returned key %q", key, st.Key)
	}
	return st
}

// absent fails unless the store holds no meter key.
func (c *tcase) absent(label, key string) {
	c.t.Helper()
	st, ok, err := c.ms().ReadMeter(c.ctx, key)
	if err != nil || ok {
		c.t.Errorf("%s: ReadMeter = %+v, %v, %v; want no meter", label, st, ok, err)
	}
}

func (c *tcase) expectUsage(label string, got, want limit.Usage) {
	c.t.Helper()
	if got != want {
		c.t.Errorf("%s: usage %+v, want %+v", label, got, want)
	}
}

func (c *tcase) adjust(m limit.Meter, delta limit.Usage) limit.MeterResult {
	c.t.Helper()
	mr, err := c.ms().Adjust(c.ctx, m, delta)
	if err != nil {
		c.t.Fatalf("Adjust(%q, %+v): %v", m.Key, delta, err)
	}
	return mr
}

// markFlushed marks the meter key flushed up to u in the generation the
// store holds (any, when it holds none).
func (c *tcase) markFlushed(key string, u limit.Usage) {
	c.t.Helper()
	st, _, err := c.ms().ReadMeter(c.ctx, key)
	if err != nil {
		c.t.Fatalf("ReadMeter(%q): %v", key, err)
	}
	if err := c.ms().MarkFlushed(c.ctx, key, st.Gen.ID, u); err != nil {
		c.t.Fatalf("MarkFlushed(%q, %+v): %v", key, u, err)
	}
}

func use(charged, refunded, calls, refundedCalls int64) limit.Usage {
	return limit.Usage{Charged: charged, Refunded: refunded, Calls: calls, RefundedCalls: refundedCalls}
}

// testMeterExactQuota: 64 goroutines hammering one quota admit exactly the
// quota, with or without checks, and count each admitted call once;
// concurrent Adjusts all add up.
func testMeterExactQuota(c *tcase) {
	c.align()
	const workers = 64
	hammer := func(tries int, cost int64, m limit.Meter, checks ...limit.Check) (admitted, units int64) {
		var n, u atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range tries {
					d, mr, err := c.ms().TakeMetered(c.ctx, checks, m, cost)
					if err != nil {
						c.t.Errorf("TakeMetered: %v", err)
						return
					}
					if d.Allowed != mr.Allowed {
						c.t.Errorf("decision %v, meter %v: the checks never deny here", d.Allowed, mr.Allowed)
					}
					if d.Allowed {
						n.Add(1)
						u.Add(cost)
					}
				}
			})
		}
		wg.Wait()
		return n.Load(), u.Load()
	}

	tenant := "meter-q-" + c.id
	r := ruleFor(limit.FixedWindow, "q", 1000)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 50)
	if n, _ := hammer(5, 1, m, ch); n != 50 {
		c.t.Errorf("%d goroutines x 5 calls on a quota of 50: %d admitted, want exactly 50", workers, n)
	}
	c.expectUsage("after the hammering", c.read(m.Key).Live, use(50, 0, 50, 0))
	// the check was charged once per admitted call, and only then
	c.expect("check after the hammering", c.take(1, ch), r, want2(1000-50-1))

	// Without checks, cost 3 on a quota of 100: 33 calls fit.
	m2 := c.meter(tenant+"-2", 100)
	if n, u := hammer(3, 3, m2); n != 33 || u != 99 {
		c.t.Errorf("cost 3 on a quota of 100: %d calls (%d units) admitted, want exactly 33 (99)", n, u)
	}
	c.expectUsage("zero-check meter after the hammering", c.read(m2.Key).Live, use(99, 0, 33, 0))

	// Concurrent corrections: nothing lost, nothing counted twice.
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range 4 {
				if _, err := c.ms().Adjust(c.ctx, m2, use(2, 1, 0, 0)); err != nil {
					c.t.Errorf("Adjust: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	c.expectUsage("after concurrent Adjusts", c.read(m2.Key).Live, use(99+2*4*workers, 4*workers, 33, 0))
}

// testMeterAllOrNothing: for every algorithm, a quota denial charges no
// check (and takes no slot) and a check denial charges no meter.
func testMeterAllOrNothing(c *tcase) {
	c.align()
	for _, alg := range limit.Algorithms {
		tenant := fmt.Sprintf("meter-aon-%s-%s", c.id, alg)
		r := ruleFor(alg, "aon", 5)
		ch := tenantCheck(tenant, r)
		m := c.meter(tenant, 3)
		label := func(s string) string { return string(alg) + ": " + s }

		d, mr := c.takeM(m, 1, ch)
		if !d.Allowed || !mr.Allowed || d.Rule != r {
			c.t.Errorf("%s: %+v, %+v; want admitted, decided by %s", label("first call"), d, mr, r.Name)
		}
		c.expectUsage(label("first call"), mr.Usage, use(1, 0, 1, 0))

		// The quota denies (1+3 > 3) while the check would allow.
		d, mr = c.takeM(m, 3, ch)
		if d.Allowed || mr.Allowed || mr.NeedSeed || d.Rule.Name != "" || d.Lease != "" || !d.Results[0].Allowed {
			c.t.Errorf("%s: %+v, %+v; want denied by the quota alone: zero Rule, no lease, the check allowing", label("quota denial"), d, mr)
		}
		if d.Limit != 0 || d.Remaining != 0 || d.RetryAfter != 0 || d.ResetAfter != 0 {
			c.t.Errorf("%s: decision numbers %+v, want zeros (the quota's are in the MeterResult)", label("quota denial"), d)
		}
		c.expectUsage(label("quota denial"), mr.Usage, use(1, 0, 1, 0))
		// the check was not charged: 5 - 1 (first call) - 1 (this one)
		c.expect(label("check after a quota denial"), c.take(1, ch), r, want2(3))

		// Exhaust the check; then it denies and the meter is not charged.
		c.exhaust(10, ch)
		d, mr = c.takeM(m, 1, ch)
		if d.Allowed || !mr.Allowed || d.Rule != r || d.Lease != "" {
			c.t.Errorf("%s: %+v, %+v; want denied by %s with the meter allowing", label("check denial"), d, mr, r.Name)
		}
		c.expectUsage(label("check denial"), mr.Usage, use(1, 0, 1, 0))
		// both deny: the check decides
		if d, mr = c.takeM(m, 3, ch); d.Allowed || mr.Allowed || d.Rule != r {
			c.t.Errorf("%s: %+v, %+v; want denied by %s, meter denying too", label("both deny"), d, mr, r.Name)
		}
		c.expectUsage(label("meter after the denials"), c.read(m.Key).Live, use(1, 0, 1, 0))

		// A denying shadow check does not stop the call; the meter counts it.
		sh := ruleFor(alg, "aon-shadow", 5)
		sh.Shadow = true
		shc := tenantCheck(tenant, sh)
		c.exhaust(10, shc)
		if d, mr = c.takeM(m, 2, shc); !d.Allowed || !mr.Allowed || d.Results[0].Allowed {
			c.t.Errorf("%s: %+v, %+v; want admitted with the shadow check denying", label("shadow"), d, mr)
		}
		c.expectUsage(label("after the shadow call"), mr.Usage, use(3, 0, 2, 0))
	}
}

// testMeterZeroChecks: a tool with only a quota meters without checks.
func testMeterZeroChecks(c *tcase) {
	tenant := "meter-zero-" + c.id
	m := c.meter(tenant, 5)
	for k := int64(1); k <= 2; k++ {
		d, mr := c.takeM(m, 2)
		if !d.Allowed || !mr.Allowed {
			c.t.Fatalf("call %d: %+v, %+v; want admitted", k, d, mr)
		}
		c.expectUsage(fmt.Sprintf("call %d", k), mr.Usage, use(2*k, 0, k, 0))
	}
	if d, mr := c.takeM(m, 2); d.Allowed || mr.Allowed {
		c.t.Errorf("cost 2 with 1 left: %+v, %+v; want denied", d, mr)
	}
	if d, mr := c.takeM(m, 1); !d.Allowed || mr.Usage != use(5, 0, 3, 0) {
		c.t.Errorf("cost 1 with 1 left: %+v, %+v; want admitted, usage 5", d, mr)
	}
	if d, _ := c.takeM(m, 1); d.Allowed {
		c.t.Error("admitted over the quota")
	}
	// Quota 0: counted, never denied.
	free := c.meter(tenant+"-free", 0)
	for range 3 {
		if d, _ := c.takeM(free, 1_000_000_000); !d.Allowed {
			c.t.Fatal("a meter without quota denied")
		}
	}
	c.expectUsage("no quota", c.read(free.Key).Live, use(3_000_000_000, 0, 3, 0))
}

// testMeterCost: a cost above the remaining quota is denied while a
// smaller one passes.
func testMeterCost(c *tcase) {
	c.align()
	tenant := "meter-cost-" + c.id
	r := ruleFor(limit.FixedWindow, "cost", 100)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 10)
	for _, st := range []struct {
		cost  int64
		ok    bool
		usage limit.Usage
	}{
		{7, true, use(7, 0, 1, 0)},
		{4, false, use(7, 0, 1, 0)},
		{11, false, use(7, 0, 1, 0)},
		{3, true, use(10, 0, 2, 0)},
		{1, false, use(10, 0, 2, 0)},
	} {
		d, mr := c.takeM(m, st.cost, ch)
		if d.Allowed != st.ok || mr.Allowed != st.ok {
			c.t.Errorf("cost %d: %+v, %+v; want allowed %v", st.cost, d, mr, st.ok)
		}
		c.expectUsage(fmt.Sprintf("cost %d", st.cost), mr.Usage, st.usage)
	}
	c.expect("check after the metered calls", c.take(1, ch), r, want2(100-10-1))
}

// testMeterSeed: a missing counter needs a Seed; a Seeded call creates it
// from the Seed (live and flushed), then charges on top; a Seed given for
// an existing counter is ignored.
func testMeterSeed(c *tcase) {
	c.align()
	tenant := "meter-seed-" + c.id
	r := ruleFor(limit.FixedWindow, "seed", 10)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 95)
	m.Seeded = false
	d, mr := c.takeM(m, 5, ch)
	if d.Allowed || !mr.NeedSeed || mr.Allowed || !d.Results[0].Allowed {
		c.t.Fatalf("unseeded call on a missing counter: %+v, %+v; want NeedSeed, denied, the check allowing", d, mr)
	}
	if amr := c.adjust(m, use(1, 0, 0, 0)); !amr.NeedSeed || amr.Allowed {
		c.t.Errorf("unseeded Adjust on a missing counter: %+v, want NeedSeed", amr)
	}
	c.absent("after NeedSeed", m.Key)
	c.expect("check after NeedSeed", c.take(1, ch), r, want2(9)) // not charged by the NeedSeed call

	seed := use(100, 10, 20, 2)
	seeded := m
	seeded.Seeded, seeded.Seed = true, seed
	d, mr = c.takeM(seeded, 5, ch) // used 90 + 5 <= 95
	if !d.Allowed || !mr.Allowed || mr.NeedSeed {
		c.t.Fatalf("seeded call: %+v, %+v; want admitted", d, mr)
	}
	c.expectUsage("seeded call", mr.Usage, use(105, 10, 21, 2))
	st := c.read(m.Key)
	c.expectUsage("live after the seeded call", st.Live, use(105, 10, 21, 2))
	c.expectUsage("flushed after the seeded call (the seed is the durable total)", st.Flushed, seed)
	if st.Tenant != tenant || st.Period != meterPeriod {
		c.t.Errorf("meter stored as tenant %q period %q, want %q %q", st.Tenant, st.Period, tenant, meterPeriod)
	}

	// The counter exists: no Seed needed, and another Seed is ignored.
	if d, mr = c.takeM(m, 1, ch); d.Allowed || mr.Allowed || mr.NeedSeed {
		c.t.Errorf("unseeded call on the existing counter at its quota: %+v, %+v; want a quota denial", d, mr)
	}
	other := seeded
	other.Seed = use(1, 0, 1, 0)
	other.Quota = 1000
	if d, mr = c.takeM(other, 1, ch); !d.Allowed || mr.Usage != use(106, 10, 22, 2) {
		c.t.Errorf("call with another Seed: %+v, %+v; want admitted on the stored counter (106 charged)", d, mr)
	}

	// A Seeded call creates the counter even when it is denied.
	denied := c.meter(tenant+"-denied", 50)
	denied.Seed = use(60, 10, 7, 1)
	if d, mr = c.takeM(denied, 1); d.Allowed || mr.Allowed || mr.Usage != denied.Seed {
		c.t.Errorf("seeded call at its quota: %+v, %+v; want denied with the seed as usage", d, mr)
	}
	st = c.read(denied.Key)
	c.expectUsage("denied seeded call, live", st.Live, denied.Seed)
	c.expectUsage("denied seeded call, flushed", st.Flushed, denied.Seed)
}

// testMeterAdjust: Adjust charges and refunds with no quota check, frees
// quota by refunds, and re-creates a missing counter from its Seed.
func testMeterAdjust(c *tcase) {
	tenant := "meter-adjust-" + c.id
	m := c.meter(tenant, 10)
	c.takeM(m, 8)
	mr := c.adjust(m, use(5, 0, 0, 0)) // the tool reported 13, not 8
	if !mr.Allowed || mr.NeedSeed {
		c.t.Errorf("Adjust: %+v, want applied", mr)
	}
	c.expectUsage("extra charge above the quota", mr.Usage, use(13, 0, 1, 0))
	if d, _ := c.takeM(m, 1); d.Allowed {
		c.t.Error("admitted with 13 of 10 used")
	}
	c.expectUsage("refund", c.adjust(m, use(0, 6, 0, 1)).Usage, use(13, 6, 1, 1))
	if d, mr := c.takeM(m, 3); !d.Allowed || mr.Usage != use(16, 6, 2, 1) {
		c.t.Errorf("cost 3 after the refund (7 used): %+v, %+v; want admitted, 10 used", d, mr)
	}
	c.expectUsage("zero delta", c.adjust(m, limit.Usage{}).Usage, use(16, 6, 2, 1))
	_, err := c.ms().Adjust(c.ctx, m, use(0, -1, 0, 0))
	c.expectErr("negative delta", err, limit.ErrInvalidMeter)
	_, err = c.ms().Adjust(c.ctx, m, use(limit.MaxUsage+1, 0, 0, 0))
	c.expectErr("delta above MaxUsage", err, limit.ErrInvalidMeter)
	c.expectUsage("after invalid Adjusts", c.read(m.Key).Live, use(16, 6, 2, 1))

	missing := c.meter(tenant+"-missing", 0)
	missing.Seed = use(5, 0, 1, 0)
	c.expectUsage("Adjust re-creating from the seed", c.adjust(missing, use(2, 1, 0, 0)).Usage, use(7, 1, 1, 0))
	c.expectUsage("flushed part of the re-created counter", c.read(missing.Key).Flushed, missing.Seed)
}
