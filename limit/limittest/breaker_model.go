package limittest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// The breaker scenarios that compare: with the reference (a random
// sequence against limit/internal/algo), with Take and TakeMetered, across
// hostile tenants; and the refusals of invalid requests.

// testBreakerModel drives two breakers with a random sequence of Evaluate
// (with and without a check, with and without a fingerprint),
// ReportOutcome, AddDenials, ReleaseProbe and clock advances, and compares every state
// with limit/internal/algo's. As in the model scenario, the clock moves by
// whole ticks and every duration is a whole number of ticks, so a store
// whose clock also follows real time decides as the model does.
func testBreakerModel(c *tcase) {
	seed := c.seed()
	c.align()
	tenant := "br-model-" + c.id
	m := &brModel{
		c:        c,
		rnd:      rand.New(rand.NewPCG(seed, 1)),
		now:      100000 * time.Hour.Microseconds(),
		rule:     limit.Rule{Name: "model", Algorithm: limit.FixedWindow, Limit: 4, Period: time.Minute},
		state:    &algo.State{},
		breakers: map[string]*algo.Breaker{},
		calls:    map[string]*algo.CallCounter{},
	}
	check := tenantCheck(tenant, m.rule)
	var specs []limit.BreakerSpec
	for _, id := range []string{"x", "y"} {
		sp := breakerSpec(tenant, id)
		sp.ConsecutiveDenials, sp.ConsecutiveFailures = 3, 2
		sp.IdenticalCount, sp.IdenticalWithin = 3, 2*time.Minute
		specs = append(specs, sp)
	}
	// Every seed runs modelOps operations, and more (up to four times as
	// many) until the breaker has opened, admitted a probe and denied a call:
	// what the sequence covers depends on the seed alone.
	covered := func() bool { return m.opened > 0 && m.probes > 0 && m.gated > 0 }
	for i := 0; i < modelOps || !covered() && i < 4*modelOps; i++ {
		sp := specs[m.rnd.IntN(len(specs))]
		switch p := m.rnd.IntN(100); {
		case p < 50:
			if m.rnd.IntN(5) > 0 {
				sp.IdenticalKey = keyspace.BreakerCall(tenant, sp.ID, []string{"a", "b"}[m.rnd.IntN(2)])
			}
			var checks []limit.Check
			if m.rnd.IntN(10) < 7 {
				checks = []limit.Check{check}
			}
			m.eval(sp, checks)
		case p < 70:
			m.report(sp, m.rnd.IntN(10) < 6, m.rnd.IntN(2) == 0)
		case p < 73:
			m.addDenials(sp, 1+m.rnd.Int64N(2))
		case p < 76:
			m.releaseProbe(sp)
		default:
			d := time.Duration([]int64{1, 3, 6, 12, 24}[m.rnd.IntN(5)]) * tick
			c.advance(d)
			m.now += d.Microseconds()
			m.log("advance %v", d)
		}
		if c.t.Failed() {
			c.t.Fatalf("store and model disagree; last operations:\n%s", m.trace())
		}
		c.checkPace()
	}
	c.t.Logf("%d openings, %d probes, %d calls denied by an open breaker, %d probes released", m.opened, m.probes, m.gated, m.released)
	if !covered() {
		c.t.Errorf("the sequence did not open, probe and deny (seed %d)", seed)
	}
}

type brModel struct {
	c        *tcase
	rnd      *rand.Rand
	now      int64
	rule     limit.Rule
	state    *algo.State
	breakers map[string]*algo.Breaker
	calls    map[string]*algo.CallCounter
	history  []string

	opened, probes, gated, released int
}

func (m *brModel) log(format string, args ...any) {
	elapsed := time.Duration(m.now-100000*time.Hour.Microseconds()) * time.Microsecond
	m.history = append(m.history, fmt.Sprintf("t+%v: ", elapsed)+fmt.Sprintf(format, args...))
}

func (m *brModel) trace() string {
	h := m.history
	if len(h) > 20 {
		h = h[len(h)-20:]
	}
	return strings.Join(h, "\n")
}

// breaker returns a copy of the model's live state of key.
func (m *brModel) breaker(key string) algo.Breaker {
	if b := m.breakers[key]; b != nil && b.ExpiresAt > m.now {
		return *b
	}
	return algo.Breaker{}
}

func (m *brModel) put(key string, b algo.Breaker, p algo.BreakerParams) {
	b.ExpiresAt = algo.BreakerExpiry(&b, p, m.now)
	if b.ExpiresAt == 0 {
		delete(m.breakers, key)
		return
	}
	m.breakers[key] = &b
}

func (m *brModel) eval(sp limit.BreakerSpec, checks []limit.Check) {
	c := m.c
	c.t.Helper()
	o := c.eval("model", limit.Request{Checks: checks, Breaker: &sp, Cost: 1})
	p := algo.Params(sp)
	b := m.breaker(sp.Key)
	var want limit.BreakerState
	allowed := false
	deny, retry, probe := algo.BreakerGate(&b, p, m.now)
	if deny {
		m.gated++
		want = algo.BreakerView(&b, p, m.now, false)
		algo.BreakerBlocked(&want, &b, m.now)
		if !want.Open || want.RetryAfter != time.Duration(retry)*time.Microsecond {
			c.t.Fatalf("model: the gate denied for %dµs, BreakerBlocked says %+v", retry, want)
		}
	} else {
		allowed = true
		if len(checks) > 0 {
			allowed = algo.Eval(m.rule, m.state, m.now, 1, "", false).Allowed
			if allowed {
				algo.Eval(m.rule, m.state, m.now, 1, "", true)
			}
		}
		v := algo.Denied
		if allowed {
			v = algo.Admitted
		}
		var calls algo.CallCounter
		if n := m.calls[sp.IdenticalKey]; n != nil && n.ExpiresAt > m.now {
			calls = *n
		}
		opened, counted := algo.BreakerAfter(&b, p, m.now, v, probe, &calls, sp.IdenticalKey)
		m.put(sp.Key, b, p)
		want = algo.BreakerView(&b, p, m.now, opened)
		want.Probe = probe && allowed
		if counted {
			m.calls[sp.IdenticalKey] = &calls
			want.Identical = calls.N
		}
		if opened {
			m.opened++
		}
		if want.Probe {
			m.probes++
		}
	}
	fp := "-"
	if sp.IdenticalKey != "" {
		fp = sp.IdenticalKey[strings.LastIndexByte(sp.IdenticalKey, ':')+1:]
	}
	m.log("eval %s fp %s checks %d: store allowed=%v %+v, model allowed=%v %+v", sp.Subject, fp, len(checks), o.Decision.Allowed, o.Breaker, allowed, want)
	if o.Decision.Allowed != allowed {
		c.t.Errorf("eval: store Allowed=%v, model %v", o.Decision.Allowed, allowed)
	}
	m.compare("eval", o.Breaker, want)
}

func (m *brModel) report(sp limit.BreakerSpec, failed, probe bool) {
	c := m.c
	c.t.Helper()
	got := c.report("model", sp, failed, probe)
	m.update(sp, got, fmt.Sprintf("report failed=%v probe=%v", failed, probe), func(b *algo.Breaker, p algo.BreakerParams) bool {
		return algo.BreakerReport(b, p, m.now, failed, probe)
	})
}

func (m *brModel) addDenials(sp limit.BreakerSpec, n int64) {
	c := m.c
	c.t.Helper()
	got := c.addDenials("model", sp, n)
	m.update(sp, got, fmt.Sprintf("add %d denials", n), func(b *algo.Breaker, p algo.BreakerParams) bool {
		return algo.BreakerAddDenials(b, p, m.now, n)
	})
}

// releaseProbe frees the lease of a probe in flight, in the store and the
// model (ReleaseProbe returns no state: the operations after it compare).
func (m *brModel) releaseProbe(sp limit.BreakerSpec) {
	c := m.c
	c.t.Helper()
	if err := c.gs().ReleaseProbe(c.ctx, sp); err != nil {
		c.t.Fatalf("model: ReleaseProbe: %v", err)
	}
	b := m.breaker(sp.Key)
	released := algo.BreakerReleaseProbe(&b, m.now)
	if released {
		m.put(sp.Key, b, algo.Params(sp))
		m.released++
	}
	m.log("release probe %s: released=%v", sp.Subject, released)
}

func (m *brModel) update(sp limit.BreakerSpec, got limit.BreakerState, op string, f func(*algo.Breaker, algo.BreakerParams) bool) {
	m.c.t.Helper()
	p := algo.Params(sp)
	b := m.breaker(sp.Key)
	opened := f(&b, p)
	m.put(sp.Key, b, p)
	want := algo.BreakerView(&b, p, m.now, opened)
	algo.BreakerBlocked(&want, &b, m.now)
	if opened {
		m.opened++
	}
	m.log("%s %s: store %+v, model %+v", op, sp.Subject, got, want)
	m.compare(op, got, want)
}

func (m *brModel) compare(label string, got, want limit.BreakerState) {
	m.c.t.Helper()
	retry := got.RetryAfter
	got.RetryAfter = want.RetryAfter
	if got != want {
		m.c.t.Errorf("%s: store %+v, model %+v", label, got, want)
		return
	}
	m.c.near(label+": RetryAfter", retry, want.RetryAfter)
}

// testBreakerSameAsTake: Evaluate without a breaker decides as Take (no
// meter) and TakeMetered (a meter) do, for every algorithm.
func testBreakerSameAsTake(c *tcase) {
	c.align()
	slack := time.Duration(0)
	if c.h.RealTime {
		slack = time.Since(c.began) + time.Second
	}
	sameDur := func(label string, a, b time.Duration) {
		c.t.Helper()
		if a != b && (a == limit.Never || b == limit.Never || a-b > slack || b-a > slack) {
			c.t.Errorf("%s: %v and %v", label, a, b)
		}
	}
	same := func(label string, a, b limit.Decision) {
		c.t.Helper()
		if a.Allowed != b.Allowed || a.Rule != b.Rule || a.Limit != b.Limit || a.Remaining != b.Remaining ||
			(a.Lease == "") != (b.Lease == "") || len(a.Results) != len(b.Results) {
			c.t.Errorf("%s: Take gave %+v, Evaluate %+v", label, a, b)
			return
		}
		sameDur(label+": ResetAfter", a.ResetAfter, b.ResetAfter)
		sameDur(label+": RetryAfter", a.RetryAfter, b.RetryAfter)
		for i := range a.Results {
			ra, rb := a.Results[i], b.Results[i]
			if ra.Allowed != rb.Allowed || ra.Remaining != rb.Remaining {
				c.t.Errorf("%s: result %d: %+v and %+v", label, i, ra, rb)
			}
		}
	}
	for _, alg := range limit.Algorithms {
		ta, tb := fmt.Sprintf("br-same-%s-%s-a", c.id, alg), fmt.Sprintf("br-same-%s-%s-b", c.id, alg)
		rules := []limit.Rule{ruleFor(alg, "same", 3), ruleFor(alg, "same-2", 5)}
		rules[1].Shadow = true
		checks := func(tenant string) []limit.Check {
			return []limit.Check{tenantCheck(tenant, rules[0]), tenantCheck(tenant, rules[1])}
		}
		ca, cb := checks(ta), checks(tb)
		ma, mb := c.meter(ta, 4), c.meter(tb, 4)
		for k, cost := range []int64{1, 2, 1, 3, 1, 1} {
			label := fmt.Sprintf("%s call %d (cost %d)", alg, k, cost)
			da := c.take(cost, ca...)
			o := c.eval(label, limit.Request{Checks: cb, Cost: cost})
			same(label, da, o.Decision)
			if o.Meter != (limit.MeterResult{}) {
				c.t.Errorf("%s: meter result %+v without a meter", label, o.Meter)
			}
			dma, mra := c.takeM(ma, cost, ca...)
			o = c.eval(label+" metered", limit.Request{Checks: cb, Meter: &mb, Cost: cost})
			same(label+" metered", dma, o.Decision)
			if noGen(mra) != noGen(o.Meter) {
				c.t.Errorf("%s metered: TakeMetered's meter %+v, Evaluate's %+v", label, mra, o.Meter)
			}
		}
	}
	// A meter alone.
	ta, tb := "br-same-meter-"+c.id+"-a", "br-same-meter-"+c.id+"-b"
	ma, mb := c.meter(ta, 3), c.meter(tb, 3)
	for k := range 3 {
		da, mra := c.takeM(ma, 2, nil...)
		o := c.eval("meter alone", limit.Request{Meter: &mb, Cost: 2})
		if da.Allowed != o.Decision.Allowed || noGen(mra) != noGen(o.Meter) || o.Decision.Rule.Name != "" {
			c.t.Errorf("meter alone, call %d: TakeMetered %+v %+v, Evaluate %+v", k, da, mra, o)
		}
	}
	_, err := c.gs().Evaluate(c.ctx, limit.Request{Cost: 1})
	c.expectErr("Evaluate of nothing", err, limit.ErrNoChecks)
}

// testBreakerHostileTenants: hostile tenant and identity names get
// breakers of their own, in the slot of their tenant's counters.
func testBreakerHostileTenants(c *tcase) {
	c.align()
	r := ruleFor(limit.FixedWindow, "br-hostile-"+c.id, 100)
	keys := map[string]string{}
	for _, tenant := range hostileTenants {
		id := "s:{x}}" + c.id
		sp := limit.BreakerSpec{
			Key: keyspace.Breaker(tenant, id), Tenant: tenant, Subject: "s{", ID: id,
			Cooldown: brCooldown, MaxCooldown: brMax, ProbeLease: brLease,
		}
		sp = identical(sp, "f:{p}", 2)
		m := c.meter(tenant, 0)
		m.Key, m.Period = keyspace.Usage(tenant, "p:"+c.id), "p:"+c.id
		req := guarded(sp, &m, tenantCheck(tenant, r))
		label := fmt.Sprintf("tenant %.20q", tenant)
		o, err := c.gs().Evaluate(c.ctx, req)
		if err != nil {
			c.t.Errorf("%s: %v", label, err)
			continue
		}
		c.expectBreaker(label+": first call", o.Breaker, brWant{identical: 1})
		c.expectBreaker(label+": second call", c.eval(label, req).Breaker,
			brWant{opened: true, reason: limit.ReasonIdentical, identical: 2, retry: brCooldown})
		c.expectBreaker(label+": third call", c.eval(label, req).Breaker,
			brWant{open: true, reason: limit.ReasonIdentical, identical: 2, retry: brCooldown})
		keys[sp.Key] = tenant
	}
	err := c.gs().ListBreakers(c.ctx, func(b limit.BreakerInfo) error {
		if tenant, ok := keys[b.Key]; ok {
			if b.Tenant != tenant || b.Subject != "s{" || !strings.HasPrefix(b.ID, "s:{x}}") {
				c.t.Errorf("breaker of tenant %.20q listed as %+v", tenant, b)
			}
			delete(keys, b.Key)
		}
		return nil
	})
	if err != nil || len(keys) != 0 {
		c.t.Errorf("ListBreakers: %v; %d hostile tenants' breakers not listed", err, len(keys))
	}
}

// testBreakerInvalid: what limit.ValidateRequest rejects is refused before
// anything is read or written.
func testBreakerInvalid(c *tcase) {
	tenant := "br-invalid-" + c.id
	r := ruleFor(limit.FixedWindow, "invalid", 5)
	ch := tenantCheck(tenant, r)
	m := c.meter(tenant, 0)
	good := identical(breakerSpec(tenant, "good"), "fp", 2)
	good.ConsecutiveDenials = 1
	bad := func(f func(*limit.BreakerSpec)) limit.BreakerSpec { sp := good; f(&sp); return sp }
	for _, tc := range []struct {
		name   string
		sp     limit.BreakerSpec
		target error
	}{
		{"empty key", bad(func(sp *limit.BreakerSpec) { sp.Key = "" }), limit.ErrInvalidBreaker},
		{"negative denials", bad(func(sp *limit.BreakerSpec) { sp.ConsecutiveDenials = -1 }), limit.ErrInvalidBreaker},
		{"denials above the bound", bad(func(sp *limit.BreakerSpec) { sp.ConsecutiveDenials = limit.MaxBreakerCount + 1 }), limit.ErrInvalidBreaker},
		{"no trigger", bad(func(sp *limit.BreakerSpec) { sp.ConsecutiveDenials, sp.IdenticalKey = 0, "" }), limit.ErrInvalidBreaker},
		{"no cooldown", bad(func(sp *limit.BreakerSpec) { sp.Cooldown = 0 }), limit.ErrInvalidBreaker},
		{"cooldown in µs", bad(func(sp *limit.BreakerSpec) { sp.Cooldown = 1500 * time.Microsecond }), limit.ErrInvalidBreaker},
		{"cooldown above the bound", bad(func(sp *limit.BreakerSpec) {
			sp.Cooldown, sp.MaxCooldown = limit.MaxBreakerDuration+time.Second, limit.MaxBreakerDuration+time.Second
		}), limit.ErrInvalidBreaker},
		{"max cooldown below cooldown", bad(func(sp *limit.BreakerSpec) { sp.MaxCooldown = sp.Cooldown / 2 }), limit.ErrInvalidBreaker},
		{"no probe lease", bad(func(sp *limit.BreakerSpec) { sp.ProbeLease = 0 }), limit.ErrInvalidBreaker},
		{"identical count 1", bad(func(sp *limit.BreakerSpec) { sp.IdenticalCount = 1 }), limit.ErrInvalidBreaker},
		{"no identical window", bad(func(sp *limit.BreakerSpec) { sp.IdenticalWithin = 0 }), limit.ErrInvalidBreaker},
		{"identical key is the key", bad(func(sp *limit.BreakerSpec) { sp.IdenticalKey = sp.Key }), limit.ErrDuplicateKey},
		{"key is a check's", bad(func(sp *limit.BreakerSpec) { sp.Key = ch.Key }), limit.ErrDuplicateKey},
		{"identical key is the meter's", bad(func(sp *limit.BreakerSpec) { sp.IdenticalKey = m.Key }), limit.ErrDuplicateKey},
	} {
		_, err := c.gs().Evaluate(c.ctx, guarded(tc.sp, &m, ch))
		c.expectErr(tc.name, err, tc.target)
		if !strings.Contains(tc.name, "'s") {
			_, err = c.gs().ReportOutcome(c.ctx, tc.sp, true, false)
			c.expectErr(tc.name+" (ReportOutcome)", err, limit.ErrInvalidBreaker)
			_, err = c.gs().AddDenials(c.ctx, tc.sp, 1)
			c.expectErr(tc.name+" (AddDenials)", err, limit.ErrInvalidBreaker)
		}
	}
	req := alone(good)
	req.Cost = 0
	_, err := c.gs().Evaluate(c.ctx, req)
	c.expectErr("cost 0", err, limit.ErrInvalidCost)
	badRule := r
	badRule.Limit = 0
	_, err = c.gs().Evaluate(c.ctx, guarded(good, nil, limit.Check{Rule: badRule, Key: ch.Key}))
	c.expectErr("bad rule", err, limit.ErrInvalidRule)
	// A meter error writes nothing, the breaker's state included.
	past := m
	past.ExpireAt = c.storeNow().Add(-time.Hour)
	_, err = c.gs().Evaluate(c.ctx, guarded(good, &past, ch))
	c.expectErr("meter expired", err, limit.ErrMeterExpired)
	if ttls := c.tenantTTLs(tenant); len(ttls) != 0 {
		c.t.Errorf("invalid requests wrote %v", ttls)
	}
}

// testBreakerNoScript: after the server forgets its scripts, every breaker
// call still works and applies exactly once.
func testBreakerNoScript(c *tcase) {
	tenant := "br-noscript-" + c.id
	sp := identical(breakerSpec(tenant, "n"), "fp", 3)
	sp.ConsecutiveDenials, sp.ConsecutiveFailures = 4, 3
	c.h.FlushScripts(c.t)
	c.expectBreaker("call after flush", c.eval("call", alone(sp)).Breaker, brWant{identical: 1})
	c.h.FlushScripts(c.t)
	c.expectBreaker("report after flush", c.report("report", sp, true, false), brWant{failures: 1})
	c.h.FlushScripts(c.t)
	c.expectBreaker("add denials after flush", c.addDenials("add", sp, 2), brWant{denials: 2, failures: 1})
	c.h.FlushScripts(c.t)
	if ok, err := c.gs().ResetBreaker(c.ctx, sp.Key); !ok || err != nil {
		c.t.Errorf("ResetBreaker after flush: %v, %v", ok, err)
	}
	c.expectBreaker("call after the reset", c.eval("call", alone(sp)).Breaker, brWant{identical: 2})
}

// noGen is mr without its generation's id: two meters created alike have
// the same seed, never the same id.
func noGen(mr limit.MeterResult) limit.MeterResult {
	mr.Gen.ID = ""
	return mr
}
