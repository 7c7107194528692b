package limittest

import (
	"fmt"

	"github.com/mcpgate/mcpgate/limit"
)

// testMeterSeparateCost: with Meter.Cost set, the checks are charged the
// request's cost (here a call: 1) and the meter Meter.Cost units, for
// TakeMetered and, on a limit.GuardedStore, for Evaluate; the quota is
// exact in meter units; a quota denial charges no check; Adjust ignores
// Meter.Cost.
func testMeterSeparateCost(c *tcase) {
	c.align()
	tenant := "meter-sep-" + c.id
	r := ruleFor(limit.FixedWindow, "calls", 5)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 30) // room for 4 calls of 7, and 2 units left over
	m.Cost = 7
	for k := int64(1); k <= 4; k++ {
		d, mr := c.takeM(m, 1, ch)
		if !d.Allowed || !mr.Allowed || d.Results[0].Remaining != 5-k {
			c.t.Fatalf("call %d: %+v, %+v; want admitted, the check charged 1 (remaining %d)", k, d, mr, 5-k)
		}
		c.expectUsage(fmt.Sprintf("call %d", k), mr.Usage, use(7*k, 0, k, 0))
	}
	// 28 used + 7 > 30, though 2 units (and a call of the check) are left.
	d, mr := c.takeM(m, 1, ch)
	if d.Allowed || mr.Allowed || mr.NeedSeed || d.Rule.Name != "" || !d.Results[0].Allowed {
		c.t.Errorf("call over the quota: %+v, %+v; want a quota denial with the check admitting", d, mr)
	}
	c.expectUsage("after the quota denial", c.read(m.Key).Live, use(28, 0, 4, 0))
	c.expect("check after the quota denial", c.take(1, ch), r, want2(0)) // 4 metered calls + this one

	// The quota admits a meter cost that fits exactly.
	exact := c.meter(tenant+"-exact", 14)
	exact.Cost = 7
	for k := int64(1); k <= 2; k++ {
		if d, mr := c.takeM(exact, 1); !d.Allowed || mr.Usage != use(7*k, 0, k, 0) {
			c.t.Errorf("exact quota, call %d: %+v, %+v; want admitted, %d charged", k, d, mr, 7*k)
		}
	}
	if d, mr := c.takeM(exact, 1); d.Allowed || mr.Allowed || mr.Usage != use(14, 0, 2, 0) {
		c.t.Errorf("exact quota used up: %+v, %+v; want denied", d, mr)
	}

	// A request cost above 1 still goes to the checks alone.
	units := ruleFor(limit.FixedWindow, "units", 10)
	uch := tenantCheck(tenant+"-free", units) // a meter's slot is its tenant's
	free := c.meter(tenant+"-free", 0)
	free.Cost = 7
	if d, mr := c.takeM(free, 3, uch); !d.Allowed || d.Results[0].Remaining != 7 || mr.Usage != use(7, 0, 1, 0) {
		c.t.Errorf("cost 3, meter cost 7: %+v, %+v; want the check charged 3 and the meter 7", d, mr)
	}
	c.expectUsage("Adjust ignores Meter.Cost", c.adjust(free, use(2, 1, 0, 0)).Usage, use(9, 1, 1, 0))

	if _, guarded := c.h.Store.(limit.GuardedStore); !guarded {
		return
	}
	// Evaluate with a breaker charges as TakeMetered does.
	gt := tenant + "-guarded"
	gm := c.meter(gt, 14)
	gm.Cost = 7
	gr := ruleFor(limit.FixedWindow, "guarded-calls", 5)
	gch := tenantCheck(gt, gr)
	sp := breakerSpec(gt, "sep")
	sp.ConsecutiveFailures = 3 // a trigger that the denials below leave alone
	req := guarded(sp, &gm, gch)
	for k := int64(1); k <= 2; k++ {
		o := c.eval(fmt.Sprintf("guarded call %d", k), req)
		if !o.Decision.Allowed || o.Decision.Results[0].Remaining != 5-k {
			c.t.Errorf("guarded call %d: %+v; want admitted, the check charged 1", k, o)
		}
		c.expectUsage(fmt.Sprintf("guarded call %d", k), o.Meter.Usage, use(7*k, 0, k, 0))
	}
	if o := c.eval("guarded call over the quota", req); o.Decision.Allowed || o.Meter.Allowed || o.Meter.Usage != use(14, 0, 2, 0) {
		c.t.Errorf("guarded call over the quota: %+v; want a quota denial", o)
	}
	c.expect("guarded check after the quota denial", c.take(1, gch), gr, want2(2))
}
