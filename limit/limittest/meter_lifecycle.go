package limittest

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// The meter scenarios of a meter's life after its calls: flushing, the
// sweep that finds unflushed meters, expiry, hostile names, validation and
// lost scripts.

// testMeterMarkFlushed: the flushed part is a field-by-field maximum that
// never goes down, marking a missing meter creates nothing
// (limit.ErrMeterMissing), and a snapshot of another generation marks
// nothing (limit.ErrMeterReplaced).
func testMeterMarkFlushed(c *tcase) {
	tenant := "meter-flushed-" + c.id
	m := c.meter(tenant, 0)
	for range 3 {
		c.takeM(m, 1)
	}
	steps := []struct{ mark, want limit.Usage }{
		{use(2, 0, 2, 0), use(2, 0, 2, 0)},
		{use(1, 0, 1, 0), use(2, 0, 2, 0)}, // a late, lower snapshot
		{use(1, 1, 3, 0), use(2, 1, 3, 0)}, // higher in some fields only
		{use(2, 0, 2, 0), use(2, 1, 3, 0)}, // a replay of the first
	}
	for i, st := range steps {
		c.markFlushed(m.Key, st.mark)
		c.expectUsage(fmt.Sprintf("flushed after mark %d", i+1), c.read(m.Key).Flushed, st.want)
	}
	c.expectUsage("live after the marks", c.read(m.Key).Live, use(3, 0, 3, 0))

	gone := keyspace.Usage(tenant+"-gone", meterPeriod)
	c.expectErr("missing meter", c.ms().MarkFlushed(c.ctx, gone, "", use(5, 0, 5, 0)), limit.ErrMeterMissing)
	c.absent("MarkFlushed on a missing meter", gone)
	gen := c.read(m.Key).Gen.ID
	c.expectErr("negative snapshot", c.ms().MarkFlushed(c.ctx, m.Key, gen, use(-1, 0, 0, 0)), limit.ErrInvalidMeter)
	c.expectErr("empty key", c.ms().MarkFlushed(c.ctx, "", gen, use(1, 0, 0, 0)), limit.ErrInvalidMeter)
	// A snapshot read from a lost generation (the store lost the meter,
	// and it was created anew from a durable total) must not cover the new
	// generation's own calls.
	c.expectErr("another generation", c.ms().MarkFlushed(c.ctx, m.Key, "lost"+c.id, use(9, 9, 9, 9)), limit.ErrMeterReplaced)
	c.expectErr("no generation", c.ms().MarkFlushed(c.ctx, m.Key, "", use(9, 9, 9, 9)), limit.ErrMeterReplaced)
	c.expectUsage("flushed after refused marks", c.read(m.Key).Flushed, use(2, 1, 3, 0))
}

// testMeterScan: ScanMeters lists exactly the meters with unflushed usage.
func testMeterScan(c *tcase) {
	prefix := "meter-scan-" + c.id + "-"
	mk := func(name string) limit.Meter { return c.meter(prefix+name, 0) }
	a, b, cc, d, e := mk("a"), mk("b"), mk("c"), mk("d"), mk("e")
	c.takeM(a, 1)
	c.takeM(b, 2)
	c.markFlushed(b.Key, use(2, 0, 1, 0))
	c.takeM(cc, 1)
	c.markFlushed(cc.Key, use(1, 0, 1, 0))
	c.takeM(cc, 4)
	c.takeM(d, 1)
	c.markFlushed(d.Key, use(9, 9, 9, 9))
	e.Seed, e.Quota = use(10, 0, 5, 0), 10
	c.takeM(e, 1) // denied: created from its seed, all flushed

	got := map[string]limit.MeterState{}
	err := c.ms().ScanMeters(c.ctx, func(st limit.MeterState) error {
		if strings.HasPrefix(st.Tenant, prefix) {
			if _, dup := got[st.Key]; dup {
				c.t.Errorf("meter %q reported twice", st.Key)
			}
			st.Gen = limit.Generation{} // each store names its own
			got[st.Key] = st
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("ScanMeters: %v", err)
	}
	want := map[string]limit.MeterState{
		a.Key:  {Key: a.Key, Tenant: a.Tenant, Period: meterPeriod, Live: use(1, 0, 1, 0)},
		cc.Key: {Key: cc.Key, Tenant: cc.Tenant, Period: meterPeriod, Live: use(5, 0, 2, 0), Flushed: use(1, 0, 1, 0)},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		c.t.Errorf("ScanMeters listed\n %+v\nwant\n %+v", got, want)
	}

	stop := errors.New("stop")
	calls := 0
	err = c.ms().ScanMeters(c.ctx, func(limit.MeterState) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		c.t.Errorf("ScanMeters with fn failing: %v after %d calls, want the error of fn after 1", err, calls)
	}
}

// testMeterTTL: a meter key expires at its ExpireAt; every write of its
// live usage sets it, MarkFlushed keeps it; an ExpireAt already past is an
// error; on an exact clock the meter is gone once past it.
func testMeterTTL(c *tcase) {
	tenant := "meter-ttl-" + c.id
	m := c.meter(tenant, 0)
	// On a real-time clock TTLs are a little shorter than computed, and
	// rounded to whole milliseconds.
	slack := time.Duration(0)
	if c.h.RealTime {
		slack = 2 * time.Second
	}
	checkTTL := func(label string, at time.Time) {
		c.t.Helper()
		want := at.Sub(c.storeNow())
		ttl, ok := c.tenantTTLs(tenant)[m.Key]
		switch {
		case !ok:
			c.t.Errorf("%s: the store lists no TTL for %q", label, m.Key)
		case c.h.Now == nil:
			if ttl <= 0 {
				c.t.Errorf("%s: TTL %v, want positive", label, ttl)
			}
		case ttl < want-slack || ttl > want+slack:
			c.t.Errorf("%s: TTL %v, want %v (within %v)", label, ttl, want, slack)
		}
	}
	c.takeM(m, 1)
	checkTTL("after TakeMetered", m.ExpireAt)
	later := m
	later.ExpireAt = m.ExpireAt.Add(24 * time.Hour)
	c.adjust(later, use(1, 0, 0, 0))
	checkTTL("after Adjust with a later ExpireAt", later.ExpireAt)
	c.markFlushed(m.Key, use(2, 0, 1, 0))
	checkTTL("after MarkFlushed", later.ExpireAt)
	c.takeM(later, 1)
	checkTTL("after a second TakeMetered", later.ExpireAt)

	past := c.meter(tenant+"-past", 0)
	past.ExpireAt = c.storeNow().Add(-time.Hour)
	_, _, err := c.ms().TakeMetered(c.ctx, nil, past, 1)
	c.expectErr("TakeMetered with ExpireAt passed", err, limit.ErrMeterExpired)
	_, err = c.ms().Adjust(c.ctx, past, use(1, 0, 0, 0))
	c.expectErr("Adjust with ExpireAt passed", err, limit.ErrMeterExpired)
	c.absent("meter with ExpireAt passed", past.Key)

	if c.h.RealTime {
		return // the server expires keys on its own clock, which Advance does not move
	}
	c.advance(later.ExpireAt.Sub(c.storeNow()) - time.Microsecond)
	c.expectUsage("just before ExpireAt", c.read(m.Key).Live, use(3, 0, 2, 0))
	c.advance(time.Microsecond)
	c.absent("at ExpireAt", m.Key)
	if _, ok := c.tenantTTLs(tenant)[m.Key]; ok {
		c.t.Error("the store still lists the meter after its ExpireAt")
	}
	unseeded := m
	unseeded.Seeded = false
	unseeded.ExpireAt = c.storeNow().Add(time.Hour)
	if _, mr := c.takeM(unseeded, 1); !mr.NeedSeed {
		c.t.Errorf("unseeded call after the meter expired: %+v, want NeedSeed", mr)
	}
}

// testMeterHostileTenants: every hostile tenant name gets a meter of its
// own, stored with the exact name, in the slot of its counters.
func testMeterHostileTenants(c *tcase) {
	c.align()
	period := "p:{" + c.id + "}"
	r := ruleFor(limit.FixedWindow, "hostile-"+c.id, 10)
	for _, tenant := range hostileTenants {
		m := c.meter(tenant, 2)
		m.Key, m.Period = keyspace.Usage(tenant, period), period
		ch := tenantCheck(tenant, r)
		n := 0
		for range 4 {
			d, _, err := c.ms().TakeMetered(c.ctx, []limit.Check{ch}, m, 1)
			if err != nil {
				c.t.Errorf("tenant %.20q: %v", tenant, err)
				break
			}
			if d.Allowed {
				n++
			}
		}
		if n != 2 {
			c.t.Errorf("tenant %.20q: %d admitted on a quota of 2 (a shared meter?)", tenant, n)
		}
		st := c.read(m.Key)
		if st.Tenant != tenant || st.Period != period || st.Live != use(2, 0, 2, 0) {
			c.t.Errorf("tenant %.20q: meter %+v, want its own tenant, period and 2 calls", tenant, st)
		}
	}
}

// testMeterInvalid: what the limit.Validate* functions reject is refused
// before anything is charged; a charge past MaxUsage is an error.
func testMeterInvalid(c *tcase) {
	c.align()
	tenant := "meter-invalid-" + c.id
	r := ruleFor(limit.FixedWindow, "invalid", 5)
	ch := tenantCheck(tenant, r)
	good := c.meter(tenant, 10)
	st := c.ms()
	call := func(label string, m limit.Meter, cost int64, target error, checks ...limit.Check) {
		c.t.Helper()
		_, _, err := st.TakeMetered(c.ctx, checks, m, cost)
		c.expectErr(label, err, target)
	}
	call("cost 0", good, 0, limit.ErrInvalidCost, ch)
	call("cost -1", good, -1, limit.ErrInvalidCost)
	call("cost above MaxUsage", good, limit.MaxUsage+1, limit.ErrInvalidMeter)
	bad := func(f func(*limit.Meter)) limit.Meter { m := good; f(&m); return m }
	call("empty key", bad(func(m *limit.Meter) { m.Key = "" }), 1, limit.ErrInvalidMeter, ch)
	call("negative quota", bad(func(m *limit.Meter) { m.Quota = -1 }), 1, limit.ErrInvalidMeter)
	call("quota above MaxUsage", bad(func(m *limit.Meter) { m.Quota = limit.MaxUsage + 1 }), 1, limit.ErrInvalidMeter)
	call("negative meter cost", bad(func(m *limit.Meter) { m.Cost = -1 }), 1, limit.ErrInvalidMeter, ch)
	call("meter cost above MaxUsage", bad(func(m *limit.Meter) { m.Cost = limit.MaxUsage + 1 }), 1, limit.ErrInvalidMeter, ch)
	call("no ExpireAt", bad(func(m *limit.Meter) { m.ExpireAt = time.Time{} }), 1, limit.ErrInvalidMeter)
	call("negative seed", bad(func(m *limit.Meter) { m.Seed.Refunded = -1 }), 1, limit.ErrInvalidMeter)
	call("meter key is a check key", bad(func(m *limit.Meter) { m.Key = ch.Key }), 1, limit.ErrDuplicateKey, ch)
	badRule := r
	badRule.Limit = 0
	call("bad rule", good, 1, limit.ErrInvalidRule, limit.Check{Rule: badRule, Key: ch.Key})
	_, err := st.Adjust(c.ctx, bad(func(m *limit.Meter) { m.Key = "" }), use(1, 0, 0, 0))
	c.expectErr("Adjust with an empty key", err, limit.ErrInvalidMeter)
	c.absent("after invalid calls", good.Key)
	c.expect("check after invalid calls", c.take(1, ch), r, want2(4))

	// Overflow: the counter may reach MaxUsage, not pass it.
	top := c.meter(tenant+"-top", 0)
	top.Seed = use(limit.MaxUsage-1, 0, 0, 0)
	call("charge past MaxUsage", top, 2, limit.ErrUsageOverflow)
	topCost := top
	topCost.Cost = 2 // the meter's charge overflows, not the request's cost 1
	call("meter cost past MaxUsage", topCost, 1, limit.ErrUsageOverflow)
	c.absent("after an overflow", top.Key)
	if d, mr := c.takeM(top, 1); !d.Allowed || mr.Usage.Charged != limit.MaxUsage {
		c.t.Errorf("charge up to MaxUsage: %+v, %+v; want admitted", d, mr)
	}
	_, err = st.Adjust(c.ctx, top, use(1, 0, 0, 0))
	c.expectErr("Adjust past MaxUsage", err, limit.ErrUsageOverflow)
	c.expectUsage("after the overflows", c.read(top.Key).Live, use(limit.MaxUsage, 0, 1, 0))
}

// testMeterNoScript: after the server forgets its scripts, every meter call
// still works and applies exactly once.
func testMeterNoScript(c *tcase) {
	c.align()
	tenant := "meter-noscript-" + c.id
	r := ruleFor(limit.FixedWindow, "noscript", 10)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 100)
	c.takeM(m, 2, ch)
	c.h.FlushScripts(c.t)
	c.takeM(m, 3, ch)
	c.h.FlushScripts(c.t)
	c.adjust(m, use(1, 2, 0, 1))
	c.h.FlushScripts(c.t)
	c.markFlushed(m.Key, use(4, 0, 1, 0))
	st := c.read(m.Key)
	c.expectUsage("live", st.Live, use(6, 2, 2, 1))
	c.expectUsage("flushed", st.Flushed, use(4, 0, 1, 0))
	c.expect("check (charged 2 and 3 by the metered calls)", c.take(1, ch), r, want2(10-2-3-1))
}
