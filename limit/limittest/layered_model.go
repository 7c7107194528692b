package limittest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// The layered model scenario (layered/model) is the model scenario for
// requests with global checks (limit.Request.Global): a random sequence of
// Evaluate calls (tenant checks of several rules and algorithms, shadow
// rules among them, sometimes a usage meter, and global checks), Refund,
// Release, Adjust and clock advances, run one after the other, over two
// tenants that share the global counters. Every outcome is compared with a
// reference built from limit/internal/algo: the tenant checks, the global
// checks and the meter are evaluated on the model's counters without
// charging, the request is admitted only if every enforced check of both
// sets and the quota admit (limit.CombineRequest makes the decisions), and
// only then is anything charged. The store must return the model's Allowed,
// deciding rule, GlobalDecides, Limit, Remaining, ResetAfter and RetryAfter
// for the whole request and for the global checks alone, every check's
// result, a lease exactly when a concurrency slot was taken, and the
// meter's verdict and usage.
//
// As in the model scenario the clock moves by whole ticks and every rule's
// boundaries fall on whole ticks (modelRules), so a store whose clock also
// follows real time decides as the model does.
//
// The Redis store on a Cluster decides such a request in two halves (the
// tenant's slot, the global slot) and gives back the half that admitted
// when the other denied (limit/redisstore/layered.go). Calls here are
// sequential, so the give-back is over before the next call: the counters
// the next call sees are the model's, and the model needs no allowance for
// the window in which another caller could see a half charged. What the
// store documents as different remains, and is accepted explicitly:
//
//   - an undone meter charge is given back with Adjust (Refunded,
//     RefundedCalls), so the meter's Charged and Calls keep it, with the
//     same amount in Refunded and RefundedCalls: Used and NetCalls are the
//     model's, the four fields may exceed the model's by the undone
//     charges (see layeredMeter);
//   - the two halves run on two nodes, each on its own TIME: a tie between
//     a tenant and a global denial (equal RetryAfter in the model) may be
//     broken either way, as a real-time store may already break ties among
//     one node's checks (see the model scenario);
//   - an identical-calls count the tenant half added is kept: the sequence
//     has no breaker (the breaker scenarios cover it), so this never shows.

// testLayeredModel runs the sequence once per algorithm, as subtests
// "layered/model/<algorithm>": the tenant's rules are of that algorithm
// (and one of another), the global rules of that algorithm (and one of a
// third). The subtests run one after the other on the scenario's harness
// (one store, one clock), each on counters of its own.
func testLayeredModel(c *tcase) {
	seed := c.seed()
	for i, alg := range limit.Algorithms {
		c.t.Run(string(alg), func(t *testing.T) {
			runLayeredModel(newCase(t, c.h, alg), seed, uint64(i))
		})
	}
}

// layeredTenant is one tenant of the sequence: its counters (a list of
// alternatives per counter, as the model scenario's) and its meter.
type layeredTenant struct {
	name   string
	groups [][]limit.Check
	meter  limit.Meter
}

// layeredMeter is the model of one meter. mt is the meter of a store that
// decides a request in one atomic step. undone is what a store that
// decides it in two halves adds on top of mt: every charge it undid (the
// tenant half admitted, a global rule denied) counted in Charged and
// Refunded, and in Calls and RefundedCalls. The store must match one of
// the two, and the same one all along (split records which, once they
// differ).
type layeredMeter struct {
	mt     *algo.Meter
	undone limit.Usage
	split  *bool
}

// layeredAdmission is a request the store admitted, kept for a later
// Refund or Release: its checks of both sets, those of each set that were
// charged (that allowed), its meter (nil: none).
type layeredAdmission struct {
	tenant, global               []limit.Check
	tenantCharged, globalCharged []limit.Check
	meter                        *limit.Meter
	cost                         int64
	lease                        string
}

type layeredModel struct {
	model   // the clock, the counters, the log, the random source; its counts
	meters  map[string]*layeredMeter
	granted []layeredAdmission
	// what the sequence exercised, so that a vacuous one fails:
	// globalOnly: denied by a global rule alone (the tenant's side would
	// admit: a split store undoes its tenant half); tenantOnly: denied by
	// the tenant's checks or quota alone (a split store refunds its global
	// half); quota: denied by the quota
	globalOnly, tenantOnly, bothDenied, quota, adjusts int
}

func runLayeredModel(c *tcase, seed, stream uint64) {
	c.t.Logf("seed %d (set %s to replay), %s", seed, SeedEnv, c.alg)
	m := &layeredModel{
		model: model{
			c:      c,
			rnd:    rand.New(rand.NewPCG(seed, 2+stream)),
			now:    100000 * time.Hour.Microseconds(), // on the hour, as the store after align
			states: map[string]*algo.State{},
		},
		meters: map[string]*layeredMeter{},
	}
	n := len(limit.Algorithms)
	third := limit.Algorithms[(int(stream)+2)%n] // neither c.alg nor c.other()

	// Two tenants, each with the counters of the model scenario (one
	// counter with two alternatives, a shadow rule, a rule of another
	// algorithm). Tenant a has a quota, tenant b a meter without one.
	rs := modelRules(c.alg, "lm")
	other := modelRules(c.other(), "lo")[0]
	var tenants []*layeredTenant
	for i, name := range []string{"a", "b"} {
		o := c.owner
		o.Tenant = "lm-" + name + "-" + c.id
		oa, ob := o, o
		oa.Tool, ob.Tool = "tool-a", "tool-b"
		mt := c.meter(o.Tenant, []int64{8, 0}[i])
		tenants = append(tenants, &layeredTenant{name: name, meter: mt, groups: [][]limit.Check{
			{{Rule: rs[0], Key: keyspace.RateLimit(keyspace.PerTenant, rs[0].Name, o)}},
			{
				{Rule: rs[1], Key: keyspace.RateLimit(keyspace.PerTenantTool, rs[1].Name, oa)},
				{Rule: rs[1], Key: keyspace.RateLimit(keyspace.PerTenantTool, rs[1].Name, ob)},
			},
			{{Rule: rs[2], Key: keyspace.RateLimit(keyspace.PerSubject, rs[2].Name, o)}},
			{{Rule: other, Key: keyspace.RateLimit(keyspace.PerSubjectTool, other.Name, o)}},
		}})
	}
	// The global counters are every tenant's: their rules are named with
	// the subtest's id, apart from every other subtest's.
	gs := modelRules(c.alg, "lg-"+c.id+"-")
	gt := modelRules(third, "lt-"+c.id+"-")[1]
	var globals [][]limit.Check
	for _, r := range []limit.Rule{gs[0], gs[1], gs[2], gt} {
		globals = append(globals, []limit.Check{c.global(r)})
	}

	c.align()
	covered := func() bool {
		return m.admitted > 0 && m.globalOnly > 0 && m.tenantOnly > 0 && m.refunds > 0 && m.releases > 0
	}
	for i := 0; i < modelOps || !covered() && i < 4*modelOps; i++ {
		switch p := m.rnd.IntN(100); {
		case p < 60:
			t := tenants[m.rnd.IntN(len(tenants))]
			checks := m.pick(t.groups, []int{7, 7, 3, 4}, false)
			global := m.pick(globals, []int{4, 3, 3, 4}, true)
			var mt *limit.Meter
			if m.rnd.IntN(10) < 4 {
				mt = &t.meter
			}
			m.evaluate(t, checks, global, mt, m.cost())
		case p < 80:
			m.advanceSome()
		case p < 90:
			m.refund()
		default:
			m.release()
		}
		if c.t.Failed() {
			c.t.Fatalf("store and model disagree (seed %d, set %s to replay); last operations:\n%s", seed, SeedEnv, m.trace())
		}
		c.checkPace()
	}
	c.t.Logf("%d admitted, %d denied (%d by a global rule alone, %d by the tenant alone, %d by both, %d by the quota, %d never), %d refunds, %d adjusts, %d releases",
		m.admitted, m.denied, m.globalOnly, m.tenantOnly, m.bothDenied, m.quota, m.never, m.refunds, m.adjusts, m.releases)
	for _, t := range tenants {
		if lm := m.meters[t.meter.Key]; lm != nil && lm.split != nil {
			c.t.Logf("meter of tenant %s: usage as decided in two halves (charges undone kept in Charged and Refunded): %v", t.name, *lm.split)
		}
	}
	if !covered() {
		c.t.Errorf("the sequence did not admit, deny by a global rule alone and by the tenant alone, refund and release (seed %d)", seed)
	}
}

// pick returns a random set of checks: each group with probability
// weights[i]/10, one of its alternatives; nonEmpty: at least one.
func (m *layeredModel) pick(groups [][]limit.Check, weights []int, nonEmpty bool) []limit.Check {
	var b []limit.Check
	for {
		for i, alts := range groups {
			if m.rnd.IntN(10) < weights[i] {
				b = append(b, alts[m.rnd.IntN(len(alts))])
			}
		}
		if len(b) > 0 || !nonEmpty {
			break
		}
	}
	m.rnd.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
	return b
}

// meter returns the model of mt, created from its (zero) Seed on first use
// as the store creates it.
func (m *layeredModel) meter(mt *limit.Meter) *layeredMeter {
	lm := m.meters[mt.Key]
	if lm == nil {
		// The model never lets the meter expire: the scenario's meters
		// outlive the sequence (meterLife).
		open, _, st := algo.MeterOpen(nil, *mt, m.now, m.now+meterLife.Microseconds())
		if st != algo.MeterOK {
			m.c.t.Fatalf("model: opening meter %q: status %d", mt.Key, st)
		}
		lm = &layeredMeter{mt: open}
		m.meters[mt.Key] = lm
	}
	return lm
}

// expectUsage compares the usage a store reported for meter lm with the
// model's: exactly the model's on a store that decides in one step, or
// the model's plus the charges it undid on a store that decides in two
// halves (see layeredMeter), the same of the two all along.
func (m *layeredModel) expectUsage(label string, lm *layeredMeter, got limit.Usage) {
	c := m.c
	c.t.Helper()
	want := lm.mt.Live
	if lm.undone == (limit.Usage{}) {
		if got != want {
			c.t.Errorf("%s: meter usage %+v, want %+v", label, got, want)
		}
		return
	}
	split := want
	split.Charged += lm.undone.Charged
	split.Refunded += lm.undone.Refunded
	split.Calls += lm.undone.Calls
	split.RefundedCalls += lm.undone.RefundedCalls
	switch {
	case got != want && got != split:
		c.t.Errorf("%s: meter usage %+v, want %+v (decided in one step) or %+v (in two halves, %+v undone)", label, got, want, split, lm.undone)
	case lm.split == nil:
		isSplit := got == split
		lm.split = &isSplit
	case *lm.split && got != split:
		c.t.Errorf("%s: meter usage %+v, want %+v: the store reported the usage of a store deciding in two halves before (%+v undone)", label, got, split, lm.undone)
	case !*lm.split && got != want:
		c.t.Errorf("%s: meter usage %+v, want %+v: the store reported the usage of a store deciding in one step before", label, got, want)
	}
}

// evaluate runs one layered request on the store and on the model and
// compares the outcomes.
func (m *layeredModel) evaluate(t *layeredTenant, checks, global []limit.Check, mt *limit.Meter, cost int64) {
	c := m.c
	c.t.Helper()
	req := limit.Request{Checks: checks, Global: global, Meter: mt, Cost: cost}
	label := fmt.Sprintf("evaluate tenant %s cost %d", t.name, cost)
	o := c.layered(label, req)

	n := len(checks)
	all := append(append([]limit.Check(nil), checks...), global...)
	results := make([]limit.Result, len(all))
	for i, ch := range all {
		results[i] = algo.Eval(ch.Rule, m.state(ch.Key), m.now, cost, "", false)
	}
	var lm *layeredMeter
	meterOK := true
	if mt != nil {
		lm = m.meter(mt)
		meterOK = algo.MeterEval(lm.mt, mt.Quota, mt.CostFor(cost)) == algo.MeterOK
	}
	// All-or-nothing, independently of CombineRequest: admitted iff every
	// enforced check of both sets and the quota admit.
	tenantOK, globalOK := meterOK, true
	for i, r := range results {
		if !all[i].Rule.Shadow && !r.Allowed {
			if i < n {
				tenantOK = false
			} else {
				globalOK = false
			}
		}
	}
	md, mg, mgd := limit.CombineRequest(req, results, o.Decision.Lease, meterOK)
	if md.Allowed != (tenantOK && globalOK) || mg.Allowed != globalOK {
		c.t.Fatalf("model: CombineRequest admits %v (global %v), the checks say tenant %v global %v", md.Allowed, mg.Allowed, tenantOK, globalOK)
	}
	meterNote := ""
	if mt != nil {
		meterNote = fmt.Sprintf(" meter %s (quota %d, used %d)", t.name, mt.Quota, lm.mt.Live.Used())
	}
	m.log("evaluate cost %d tenant %s [%s] global [%s]%s: store allowed=%v rule=%s global=%v remaining=%d (global allowed=%v), model allowed=%v rule=%s global=%v remaining=%d (global allowed=%v)",
		cost, t.name, names(checks), names(global), meterNote,
		o.Decision.Allowed, o.Decision.Rule.Name, o.GlobalDecides, o.Decision.Remaining, o.Global.Allowed,
		md.Allowed, md.Rule.Name, mgd, md.Remaining, mg.Allowed)
	if o.Decision.Allowed != md.Allowed {
		c.t.Errorf("%s: store Allowed=%v, model %v (tenant side %v, global side %v)", label, o.Decision.Allowed, md.Allowed, tenantOK, globalOK)
		return
	}
	if j, ok := m.tie(all, results, md, o.Decision.Rule); ok {
		md.Rule, md.Limit, md.Remaining, md.ResetAfter = all[j].Rule, limitOf(all[j].Rule), results[j].Remaining, results[j].ResetAfter
		mgd = j >= n
	}
	if j, ok := m.tie(global, results[n:], mg, o.Global.Rule); ok {
		mg.Rule, mg.Limit, mg.Remaining, mg.ResetAfter = global[j].Rule, limitOf(global[j].Rule), results[n+j].Remaining, results[n+j].ResetAfter
	}
	c.expect(label, o.Decision, md.Rule, want{allowed: md.Allowed, remaining: md.Remaining, reset: md.ResetAfter, retry: md.RetryAfter})
	if o.GlobalDecides != mgd {
		c.t.Errorf("%s: GlobalDecides %v, want %v (deciding rule %q)", label, o.GlobalDecides, mgd, md.Rule.Name)
	}
	c.expect(label+": global decision", o.Global, mg.Rule, want{allowed: mg.Allowed, remaining: mg.Remaining, reset: mg.ResetAfter, retry: mg.RetryAfter})
	for i, r := range o.Decision.Results {
		w := results[i]
		c.expectResult(fmt.Sprintf("%s: tenant result %d (%s)", label, i, all[i].Rule.Name), r,
			want{allowed: w.Allowed, remaining: w.Remaining, reset: w.ResetAfter, retry: w.RetryAfter})
	}
	for i, r := range o.Global.Results {
		w := results[n+i]
		c.expectResult(fmt.Sprintf("%s: global result %d (%s)", label, i, global[i].Rule.Name), r,
			want{allowed: w.Allowed, remaining: w.Remaining, reset: w.ResetAfter, retry: w.RetryAfter})
	}
	slot := false // an admitted request holds a lease iff a concurrency check of either set allowed
	for i, ch := range all {
		slot = slot || ch.Rule.Algorithm == limit.Concurrency && results[i].Allowed
	}
	if want := md.Allowed && slot; want != (o.Decision.Lease != "") {
		c.t.Errorf("%s: lease %q; want a lease: %v (admitted %v, a concurrency slot taken %v)", label, o.Decision.Lease, want, md.Allowed, slot)
	}

	if !md.Allowed {
		m.denied++
		if md.RetryAfter == limit.Never {
			m.never++
		}
		switch {
		case !globalOK && tenantOK:
			m.globalOnly++
			if lm != nil {
				// A store deciding in two halves charged the meter with
				// the tenant half, then gave it back (undoTenant).
				mc := mt.CostFor(cost)
				lm.undone.Charged += mc
				lm.undone.Refunded += mc
				lm.undone.Calls++
				lm.undone.RefundedCalls++
			}
		case !globalOK:
			m.bothDenied++
		default:
			m.tenantOnly++
		}
		if !meterOK {
			m.quota++
		}
	}
	if mt != nil {
		if o.Meter.Allowed != meterOK || o.Meter.NeedSeed {
			c.t.Errorf("%s: meter result %+v, want Allowed %v", label, o.Meter, meterOK)
		}
	} else if o.Meter != (limit.MeterResult{}) {
		c.t.Errorf("%s: meter result %+v without a meter", label, o.Meter)
	}
	if !md.Allowed {
		if lm != nil {
			m.expectUsage(label, lm, o.Meter.Usage)
		}
		return
	}

	m.admitted++
	a := layeredAdmission{tenant: checks, global: global, meter: mt, cost: cost, lease: o.Decision.Lease}
	for i, ch := range all {
		algo.Eval(ch.Rule, m.state(ch.Key), m.now, cost, o.Decision.Lease, true)
		switch {
		case !results[i].Allowed: // a denying shadow check charges nothing
		case i < n:
			a.tenantCharged = append(a.tenantCharged, ch)
		default:
			a.globalCharged = append(a.globalCharged, ch)
		}
	}
	if lm != nil {
		algo.MeterCharge(lm.mt, mt.CostFor(cost), lm.mt.ExpiresAt)
		m.expectUsage(label, lm, o.Meter.Usage)
	}
	m.granted = append(m.granted, a)
}

// tie reports that the store's deciding rule got differs from the model's
// decision md of checks (results) only by how a tie was broken: both
// denying enforced rules with the RetryAfter md reports, on a store whose
// clock follows real time. A real-time store sees the counters a few
// microseconds after the model (on a Cluster, the tenant's and the global
// half each on its own node's clock), which may break the tie the other
// way: either deciding rule is right. It returns got's index in checks.
func (m *layeredModel) tie(checks []limit.Check, results []limit.Result, md limit.Decision, got limit.Rule) (int, bool) {
	if !m.c.h.RealTime || md.Allowed || got == md.Rule {
		return 0, false
	}
	j := indexOf(checks, got)
	if j < 0 || checks[j].Rule.Shadow || results[j].Allowed || results[j].RetryAfter != md.RetryAfter {
		return 0, false
	}
	return j, true
}

// refund gives back a random admitted request: the checks it charged, each
// set in a call of its own (the two sets live in different slots of a
// Cluster), and its meter charge (Adjust with Refunded, RefundedCalls).
func (m *layeredModel) refund() {
	if len(m.granted) == 0 {
		return
	}
	c := m.c
	i := m.rnd.IntN(len(m.granted))
	a := m.granted[i]
	m.granted = append(m.granted[:i], m.granted[i+1:]...)
	m.refunds++
	m.log("refund cost %d tenant [%s] global [%s] lease %q meter %v", a.cost, names(a.tenantCharged), names(a.globalCharged), a.lease, a.meter != nil)
	for _, set := range [][]limit.Check{a.tenantCharged, a.globalCharged} {
		if len(set) == 0 {
			continue
		}
		c.refund(a.cost, a.lease, set...)
		for _, ch := range set {
			algo.Refund(ch.Rule, m.state(ch.Key), m.now, a.cost, a.lease)
		}
	}
	if a.meter == nil {
		return
	}
	m.adjusts++
	lm := m.meter(a.meter)
	delta := limit.Usage{Refunded: a.meter.CostFor(a.cost), RefundedCalls: 1}
	mr := c.adjust(*a.meter, delta)
	if st := algo.MeterAdjust(lm.mt, delta, lm.mt.ExpiresAt); st != algo.MeterOK {
		c.t.Fatalf("model: MeterAdjust: status %d", st)
	}
	if !mr.Allowed || mr.NeedSeed {
		c.t.Errorf("refund: Adjust %+v, want applied", mr)
	}
	m.expectUsage("refund: Adjust", lm, mr.Usage)
}

// release ends a random admitted request: Release with each set of its
// checks and its lease, in a call of its own.
func (m *layeredModel) release() {
	if len(m.granted) == 0 {
		return
	}
	a := m.granted[m.rnd.IntN(len(m.granted))]
	m.releases++
	m.log("release tenant [%s] global [%s] lease %q", names(a.tenant), names(a.global), a.lease)
	for _, set := range [][]limit.Check{a.tenant, a.global} {
		if len(set) == 0 {
			continue
		}
		m.c.release(a.lease, set...)
		for _, ch := range set {
			algo.Release(ch.Rule, m.state(ch.Key), a.lease)
		}
	}
}
