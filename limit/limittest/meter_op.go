package limittest

import (
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// testMeterOp: an op (limit.Meter.Op) applies once. A repeated metered take
// or Adjust with the same op charges nothing (neither the meter nor the
// checks, nor the breaker) and answers what the first call did; a denied op
// leaves no record, so repeating it decides afresh; a new op charges again.
func testMeterOp(c *tcase) {
	tenant := "meter-op-" + c.id
	ch := tenantCheck(tenant, limit.Rule{Name: "op-" + c.id, Algorithm: limit.FixedWindow, Limit: 3, Period: time.Hour})
	m := c.meter(tenant, 0)
	m.Op = limit.NewOp()
	d1, mr1 := c.takeM(m, 1, ch)
	if !d1.Allowed || mr1.Usage != use(1, 0, 1, 0) || mr1.Gen.ID == "" {
		c.t.Fatalf("first call of an op: %+v, %+v; want admitted, usage 1 0 1 0 and a generation", d1, mr1)
	}
	for i := range 3 {
		d, mr := c.takeM(m, 1, ch)
		if d.Allowed != d1.Allowed || d.Remaining != d1.Remaining || mr != mr1 {
			c.t.Errorf("repeat %d of an op: %+v, %+v; want the first answer %+v, %+v", i, d, mr, d1, mr1)
		}
	}
	c.expectUsage("after repeats", c.read(m.Key).Live, use(1, 0, 1, 0))
	m2 := m
	m2.Op = limit.NewOp()
	if d, mr := c.takeM(m2, 1, ch); !d.Allowed || d.Remaining != 1 || mr.Usage != use(2, 0, 2, 0) || mr.Gen != mr1.Gen {
		c.t.Errorf("a new op: %+v, %+v; want charged (1 left, usage 2 0 2 0, same generation)", d, mr)
	}

	// Through Evaluate, with a breaker: one charge, one count.
	sp := breakerSpec(tenant, "op")
	sp.ConsecutiveDenials = 100
	m3 := m
	m3.Op = limit.NewOp()
	o1 := c.eval("op via Evaluate", limit.Request{Checks: []limit.Check{ch}, Meter: &m3, Breaker: &sp, Cost: 1})
	o2 := c.eval("op via Evaluate, repeated", limit.Request{Checks: []limit.Check{ch}, Meter: &m3, Breaker: &sp, Cost: 1})
	if !o1.Decision.Allowed || o2.Decision.Allowed != o1.Decision.Allowed || o2.Meter != o1.Meter || o2.Breaker != o1.Breaker {
		c.t.Errorf("Evaluate op repeated: %+v then %+v; want the same admitted answer", o1, o2)
	}
	c.expectUsage("after Evaluate's op", c.read(m.Key).Live, use(3, 0, 3, 0))

	// The check is spent: a new op is denied and leaves no record, so
	// once room is made its repeat is decided afresh.
	m4 := m
	m4.Op = limit.NewOp()
	if d, _ := c.takeM(m4, 1, ch); d.Allowed {
		c.t.Fatalf("an op past the limit was admitted: %+v", d)
	}
	if d, mr := c.takeM(m4, 1); !d.Allowed || mr.Usage != use(4, 0, 4, 0) {
		c.t.Errorf("a denied op repeated without the check: %+v, %+v; want charged (it left no record)", d, mr)
	}

	// Adjust: once per op, and the repeat answers the same.
	a := m
	a.Op = limit.NewOp()
	ar1 := c.adjust(a, use(5, 1, 0, 0))
	ar2 := c.adjust(a, use(5, 1, 0, 0))
	if !ar1.Allowed || ar1.Usage != use(9, 1, 4, 0) || ar2 != ar1 {
		c.t.Errorf("Adjust op: %+v then %+v; want applied once (9 1 4 0) and the same answer", ar1, ar2)
	}
	c.expectUsage("after Adjust's op", c.read(m.Key).Live, use(9, 1, 4, 0))

	// A take's op placed again through Adjust, as the engine does when the
	// take's answer was lost: the take landed, so nothing more is applied,
	// and it is no error (a store that failed here would keep the usage
	// pending forever, then count it twice once the marker expired). It
	// answers the take's own meter answer, usage and generation, so the
	// caller keeps the op as if that answer had arrived: a later replay of
	// it must compare the durable total with the usage right after it,
	// not with the meter as it stands.
	for _, t := range []struct {
		op limit.Meter
		mr limit.MeterResult
	}{{m, mr1}, {m3, o1.Meter}} {
		mr, err := c.ms().Adjust(c.ctx, t.op, use(1, 0, 1, 0))
		if err != nil {
			c.t.Errorf("a take's op placed again through Adjust: %v", err)
		} else if !mr.Allowed || mr.Covered || mr.Usage != t.mr.Usage || mr.Gen != t.mr.Gen {
			c.t.Errorf("a take's op placed again through Adjust answered %+v; want the take's own %+v", mr, t.mr)
		}
	}
	c.expectUsage("after takes' ops placed again", c.read(m.Key).Live, use(9, 1, 4, 0))

	// A bad op id charges nothing.
	bad := m
	bad.Op = "a b"
	_, _, err := c.ms().TakeMetered(c.ctx, []limit.Check{ch}, bad, 1)
	c.expectErr("op with a space", err, limit.ErrInvalidMeter)
	_, err = c.ms().Adjust(c.ctx, limit.Meter{Key: m.Key, Tenant: m.Tenant, Period: m.Period, ExpireAt: m.ExpireAt,
		Op: limit.NewOp(), Replay: &limit.Replay{Gen: "x"}}, limit.Usage{})
	c.expectErr("replay of nothing", err, limit.ErrInvalidMeter)
}

// testMeterReplay: an Adjust with a Replay places usage applied in a lost
// generation of the meter only when that usage is not already counted: not
// in the generation it was applied in, nor when the current generation's
// seed holds it.
func testMeterReplay(c *tcase) {
	tenant := "meter-replay-" + c.id
	m := c.meter(tenant, 0)
	m.Op = limit.NewOp()
	_, mr := c.takeM(m, 2)
	gen := mr.Gen
	if gen.ID == "" || gen.Seed != (limit.Usage{}) {
		c.t.Fatalf("generation of a new meter %+v, want an id and a zero seed", gen)
	}
	if st := c.read(m.Key); st.Gen != gen {
		c.t.Errorf("ReadMeter's generation %+v, want %+v", st.Gen, gen)
	}
	// A replay of the op into its own generation: already counted.
	r := m
	r.Op = limit.NewOp()
	r.Replay = &limit.Replay{Gen: gen.ID, After: mr.Usage}
	if ar := c.adjust(r, use(2, 0, 1, 0)); ar.Allowed || !ar.Covered || ar.Usage != use(2, 0, 1, 0) {
		c.t.Errorf("replay into the op's own generation: %+v, want covered, nothing applied", ar)
	}
	// A replay from a lost generation, not held by this one's seed: applied once.
	r.Op = limit.NewOp()
	r.Replay = &limit.Replay{Gen: "lost" + c.id, After: use(5, 0, 3, 0)}
	if ar := c.adjust(r, use(2, 0, 1, 0)); !ar.Allowed || ar.Covered || ar.Usage != use(4, 0, 2, 0) {
		c.t.Errorf("replay from a lost generation: %+v, want applied (4 0 2 0)", ar)
	}
	if ar := c.adjust(r, use(2, 0, 1, 0)); ar.Usage != use(4, 0, 2, 0) {
		c.t.Errorf("replay repeated: %+v, want nothing more applied", ar)
	}

	// A meter re-created from a seed that holds the op (it was flushed
	// before the loss): the replay is covered, and it creates the meter.
	t2 := "meter-replay2-" + c.id
	m2 := c.meter(t2, 0)
	m2.Seed = use(10, 1, 6, 0)
	m2.Op = limit.NewOp()
	m2.Replay = &limit.Replay{Gen: "lost" + c.id, After: use(9, 0, 5, 0)}
	ar := c.adjust(m2, use(3, 0, 1, 0))
	if ar.Allowed || !ar.Covered || ar.Usage != m2.Seed || ar.Gen.Seed != m2.Seed {
		c.t.Errorf("replay held by the seed: %+v, want covered with the meter created from its seed", ar)
	}
	// One the seed does not hold in the fields it raises: applied.
	m2.Op = limit.NewOp()
	m2.Replay = &limit.Replay{Gen: "lost" + c.id, After: use(12, 0, 7, 0)}
	if ar := c.adjust(m2, use(2, 0, 1, 0)); !ar.Allowed || ar.Usage != use(12, 1, 7, 0) {
		c.t.Errorf("replay past the seed: %+v, want applied (12 1 7 0)", ar)
	}
}
