package enforce

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
)

// ruleSet is the checks of one request for one slot (the tenant's, or the
// global one), with the scope of each rule for the 429 body.
type ruleSet struct {
	checks []limit.Check
	per    []keyspace.Per
	// kept is how many trailing checks are concurrency slots that outlive
	// the call (a session's): the verdict's release leaves them held, and
	// verdict.lease names them.
	kept int
}

func buildRuleSet(rules []policy.Rule, owner keyspace.Owner) ruleSet {
	rs := ruleSet{checks: make([]limit.Check, len(rules)), per: make([]keyspace.Per, len(rules))}
	for i, r := range rules {
		rs.checks[i] = limit.Check{Rule: r.Rule, Key: keyspace.Counter(r.Per, string(r.Algorithm), r.Name, owner)}
		rs.per[i] = r.Per
	}
	return rs
}

// scopeOf returns the scope (`per`) of the rule that made d.
func (rs ruleSet) scopeOf(d limit.Decision) keyspace.Per {
	for i, c := range rs.checks {
		if c.Rule == d.Rule {
			return rs.per[i]
		}
	}
	return ""
}

// verdict is the limit stage's answer for one call.
type verdict struct {
	allowed bool
	// decision fills the rate-limit headers: the denying one, or the most
	// restrictive admitted one. Zero (no Rule) when no rule applied or the
	// store failed open.
	decision limit.Decision
	scope    keyspace.Per
	// unavailable: the store failed and the tool's policy is closed (503).
	unavailable bool
	// degraded names the failure policy applied when the store failed ("" if not).
	degraded policy.FailurePolicy
	// fromCache: the denial came from the local denial cache.
	fromCache bool
	// quota: the monthly quota denied the call; usage is the meter as it stands.
	quota bool
	usage limit.Usage
	// metered: the call was charged on its meter in the store. pending: it
	// was admitted without a known charge (a store was down), so its usage
	// must be placed later; opSent: the charge was sent with the meter's op
	// and may have landed, so it is placed again with that op (the store
	// applies it once).
	metered, pending, opSent bool
	// breaker is what the loop breaker said (zero without one); breakerOpen:
	// it denied the call.
	breaker     limit.BreakerState
	breakerOpen bool
	release     func(context.Context)
	// lease and leaseStore name the slots of the tenant set's kept checks
	// (see ruleSet.kept) when the call was admitted with them taken.
	lease      string
	leaseStore limit.GuardedStore
}

// limiter is the limit stage: tenant rules, global rules, the usage meter
// and the breaker in one store request, all or nothing (on a Redis Cluster
// the store itself splits it by slot and undoes the tenant's part when a
// global rule denies).
type limiter struct {
	shared   *guardedStore      // nil: in-process only
	local    limit.GuardedStore // the store when shared is nil; else the fallback of on_error: local
	meters   *meterer           // nil: no metering
	breakers *breakerCache
	denials  *denialCache
	log      *slog.Logger
	stats    *metrics.Metrics
	tracer   trace.Tracer // nil: no span

	// Releases that failed, tried again in the background (retryRelease)
	// until closing is closed (Engine.Close, which waits for them).
	retries  sync.WaitGroup
	retrying atomic.Int64
	closing  chan struct{}
}

func noRelease(context.Context) {}

// batch is what the store call of one request (or the failure policy
// standing in for it) answered.
type batch struct {
	// d is the whole request's decision; g the global checks' own (their
	// Results, for the denial cache and shadow rules); globalDecides: d's
	// rule is a global check's.
	d, g          limit.Decision
	globalDecides bool
	// store decided d; nil when the call was admitted without a decision
	// (policy open) or could not be decided (unavailable).
	store       limit.GuardedStore
	degraded    policy.FailurePolicy // the failure policy applied, "" when the store answered
	unavailable bool                 // the store failed and the policy is closed (or a bug)
	// mr is the meter's answer; metered, whether the meter was charged (or,
	// on a denial, evaluated) in the store; opSent, whether a charge with
	// the meter's op was sent and its answer lost.
	mr      limit.MeterResult
	metered bool
	opSent  bool
	// breaker is the loop breaker's state; breakerOpen: it denied.
	breaker     limit.BreakerState
	breakerOpen bool
}

// denied reports whether the batch's store denied the call.
func (b batch) denied() bool { return b.store != nil && !b.d.Allowed }

// decide decides a call (admit is decide in a span): cost is what the call
// charges the rules (one per call), meter.Cost what it charges its usage
// meter and quota. Tenant rules, global rules, the meter and the breaker
// go to the store in one request, all or nothing (limit.Request.Global).
func (l *limiter) decide(ctx context.Context, tenant, global ruleSet, meter *limit.Meter, br *limit.BreakerSpec, cost int64, onErr policy.FailurePolicy) verdict {
	if len(tenant.checks) == 0 && len(global.checks) == 0 && meter == nil && br == nil {
		return verdict{allowed: true, release: noRelease}
	}
	if v, ok := l.answeredLocally(ctx, tenant, global, br, cost); ok {
		return v
	}
	var store limit.GuardedStore = l.local
	if l.shared != nil {
		store = l.shared
	}
	b, err := l.evaluateMetered(ctx, store, tenant, global, meter, br, cost, onErr)
	v := l.judge(b, err, tenant, global, meter, cost)
	if b.opSent && !v.allowed {
		// The charge may have landed though the call is refused (the
		// failure policy is closed, the local fallback denied it, or the
		// client went away): it is placed again with its op, which lands
		// once, and given back, so the call costs nothing either way.
		l.meters.takeBack(*meter, limit.Usage{Charged: meter.CostFor(cost), Calls: 1})
	}
	return v
}

// judge turns the store's answer (or failure) into the call's verdict.
func (l *limiter) judge(b batch, err error, tenant, global ruleSet, meter *limit.Meter, cost int64) verdict {
	switch {
	case err != nil || b.unavailable:
		return verdict{unavailable: true, degraded: b.degraded, release: noRelease}
	case b.breakerOpen:
		return verdict{breaker: b.breaker, breakerOpen: true, release: noRelease}
	case b.metered:
		l.observeQuota(meter, b.mr.Usage)
	}
	if !b.denied() {
		return l.admitted(b, tenant, global, meter)
	}
	if b.metered && !b.mr.Allowed && b.d.Rule.Name == "" {
		return verdict{quota: true, usage: b.mr.Usage, degraded: b.degraded, release: noRelease}
	}
	decider, d := tenant, b.d
	if b.globalDecides {
		decider, d = global, b.g
	}
	l.rememberDenial(b.store, decider.checks, cost, d)
	return verdict{decision: b.d, scope: decider.scopeOf(b.d), degraded: b.degraded, release: noRelease}
}

// answeredLocally answers from what this instance already knows, without
// a store call: an open loop breaker, or a denial the shared store gave
// earlier whose retry time has not come.
func (l *limiter) answeredLocally(ctx context.Context, tenant, global ruleSet, br *limit.BreakerSpec, cost int64) (verdict, bool) {
	if br != nil {
		if bs, ok := l.breakers.lookup(br.Key, l.shared == nil || l.shared.Available()); ok {
			l.stats.DenialCacheHits.Inc()
			return verdict{breaker: bs, breakerOpen: true, release: noRelease}, true
		}
	}
	if l.shared == nil {
		return verdict{}, false
	}
	for _, rs := range []ruleSet{tenant, global} {
		if d, ok := l.denials.lookup(rs.checks, cost); ok {
			l.stats.DenialCacheHits.Inc()
			if bs, open := l.breakers.deniedLocally(ctx, l.shared, br); open {
				return verdict{breaker: bs, breakerOpen: true, release: noRelease}, true
			}
			return verdict{decision: d, scope: rs.scopeOf(d), fromCache: true, release: noRelease}, true
		}
	}
	return verdict{}, false
}

// admitted is the verdict of an admitted call. Headers describe the most
// restrictive admitted rule (limit.Outcome's Decision). The concurrency
// slots the call took are released by the verdict's release, except a
// session's (tenant.kept), which its lease names.
func (l *limiter) admitted(b batch, tenant, global ruleSet, meter *limit.Meter) verdict {
	v := verdict{allowed: true, release: noRelease, degraded: b.degraded, decision: b.d,
		metered: b.metered, opSent: b.opSent, usage: b.mr.Usage, breaker: b.breaker}
	v.pending = meter != nil && !b.metered
	if b.store == nil {
		v.decision = limit.Decision{Allowed: true} // admitted without a decision: no headers
	} else if b.globalDecides {
		v.scope = global.scopeOf(b.d)
	} else {
		v.scope = tenant.scopeOf(b.d)
	}
	lease := b.d.Lease
	if lease == "" || b.store == nil {
		return v
	}
	if tenant.kept > 0 {
		v.lease, v.leaseStore = lease, b.store
	}
	own := slots(tenant.checks[:len(tenant.checks)-tenant.kept])
	globalSlots := slots(global.checks)
	if len(own) > 0 || len(globalSlots) > 0 {
		v.release = func(ctx context.Context) {
			l.releaseLease(ctx, b.store, own, lease)
			l.releaseLease(ctx, b.store, globalSlots, lease)
		}
	}
	return v
}

// slots are the concurrency checks of checks: the ones a lease holds.
func slots(checks []limit.Check) []limit.Check {
	var out []limit.Check
	for _, c := range checks {
		if c.Rule.Algorithm == limit.Concurrency {
			out = append(out, c)
		}
	}
	return out
}

// evaluateMetered runs the request in store. A meter the store lost is
// seeded from the durable total; if that total cannot be read, the call is
// decided without the meter (its usage then waits in process) unless the
// tool fails closed. A store failure is answered by the failure policy.
func (l *limiter) evaluateMetered(ctx context.Context, store limit.GuardedStore, tenant, global ruleSet, meter *limit.Meter, br *limit.BreakerSpec, cost int64, onErr policy.FailurePolicy) (batch, error) {
	start := time.Now()
	req := limit.Request{Checks: tenant.checks, Global: global.checks, Meter: meter, Breaker: br, Cost: cost}
	var (
		b   batch
		err error
		// gone: the caller had left before the store was last asked, so
		// the request never left (a store checks ctx before any work).
		gone bool
	)
	eval := func() {
		gone = ctx.Err() != nil
		b, err = l.evaluate(ctx, store, req)
	}
	eval()
	if err == nil && b.mr.NeedSeed && !b.breakerOpen && meter != nil {
		seeded, serr := l.meters.seed(ctx, *meter)
		if serr != nil {
			l.log.Warn("usage meter cannot be rebuilt: the durable total is unreadable", "tenant", meter.Tenant, "period", meter.Period, "err", serr)
			if onErr == policy.FailClosed {
				return batch{unavailable: true}, nil
			}
			req.Meter = nil
			eval()
		} else {
			// The store lost the meter: what this instance wrote to it and
			// the durable store may not hold goes back first, so that the
			// quota is decided on it. The seed goes on this request only:
			// the call's own meter (its ticket's) stays unseeded, for a
			// correction at its end may find the meter lost again, and must
			// then read the durable total as it is by then (NeedSeed), not
			// re-create the meter from this one, which the usage flushed
			// meanwhile has outgrown.
			req.Meter = &seeded
			l.meters.replayLost(ctx, seeded)
			eval()
		}
	}
	l.stats.DecisionSeconds.Observe(time.Since(start).Seconds())
	switch {
	case err == nil && b.breakerOpen:
		return b, nil
	case err == nil && !b.mr.NeedSeed:
		l.countShadow(tenant.checks, b.d)
		l.countShadow(global.checks, b.g)
		switch {
		case req.Meter == nil:
		case b.d.Allowed:
			// charged records the store's report too (saw)
			l.meters.charged(*meter, limit.Usage{Charged: meter.CostFor(cost), Calls: 1}, b.mr)
		case store == l.shared:
			l.meters.saw(*meter, b.mr.Usage)
		}
		b.metered = req.Meter != nil
		return b, nil
	case err == nil: // nothing charged
		return l.degrade(ctx, store, tenant, global, meter, cost, onErr, errors.New("usage meter still missing after seeding"))
	case req.Meter != nil && meterFull(err):
		// The store answered and charged nothing: this tenant's meter can
		// take no more this period. No failure policy applies (the store
		// is up; on_error: open would admit calls no meter can count): the
		// call is refused, and nothing was sent that could have landed.
		l.log.Error("usage meter cannot be charged: the call is refused", "tenant", meter.Tenant, "period", meter.Period, "err", err)
		return batch{unavailable: true}, nil
	}
	// Whatever the failure, a charge that may have reached the shared store
	// is placed again with the same op: the store applies it only if this
	// attempt did not land, so the engine need not guess which failures
	// may have landed. One that cannot have reached it is not: the breaker
	// refused it (ErrStoreDown), the caller was gone before it was sent,
	// or it went to the in-process store, whose answer is never lost.
	// Placed again and taken back, such a charge would show, in the usage
	// store, a call admitted (and refunded) that never was.
	sent := req.Meter != nil && store != l.local && !gone && !errors.Is(err, ErrStoreDown)
	var d batch
	if bs, open := l.knownOpen(ctx, store, br); open {
		// The breaker decides this call, not the store's failure: the
		// error is spent here, or judge would answer it as an outage
		// (503) instead of the breaker's refusal.
		d, err = batch{breaker: bs, breakerOpen: true}, nil
	} else {
		d, err = l.degrade(ctx, store, tenant, global, meter, cost, onErr, err)
	}
	d.opSent = sent
	return d, err
}

// knownOpen answers a call whose store failed with its loop breaker when
// this instance knows that breaker open until a time not yet come (the
// in-process entry outlives its hold for this): the failure policy would
// admit the calls the breaker stopped for as long as the store is down.
func (l *limiter) knownOpen(ctx context.Context, store limit.GuardedStore, br *limit.BreakerSpec) (limit.BreakerState, bool) {
	if br == nil || store == l.local || ctx.Err() != nil {
		return limit.BreakerState{}, false
	}
	return l.breakers.stillOpen(br.Key)
}

// degrade applies the tool's failure policy after store failed with err.
// An error return means the call cannot be decided (a bug, or the client
// went away).
func (l *limiter) degrade(ctx context.Context, store limit.GuardedStore, tenant, global ruleSet, meter *limit.Meter, cost int64, onErr policy.FailurePolicy, err error) (batch, error) {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The client went away (the in-process store checks ctx too, which
		// is no bug); whatever we answer, nobody reads it.
		return batch{unavailable: true}, ctx.Err()
	}
	if store == l.local || errors.Is(err, limit.ErrInvalidRule) || errors.Is(err, limit.ErrInvalidCost) || errors.Is(err, limit.ErrInvalidMeter) {
		// The in-process store does not fail for outside reasons: a bug.
		l.log.Error("limit decision failed", "err", err)
		return batch{unavailable: true}, err
	}
	if ctx.Err() != nil {
		// The client went away; whatever we answer, nobody reads it.
		return batch{unavailable: true}, ctx.Err()
	}
	if errors.Is(err, limit.ErrStoreRefused) {
		// The store is up and refused this call (a key of the wrong type,
		// a permission missing): no failure policy applies, on_error: open
		// would admit what the store could not check.
		l.log.Error("limit store refused the call: it cannot be decided and is refused", "err", err)
		return batch{unavailable: true}, nil
	}
	l.stats.Degraded.WithLabelValues(string(onErr)).Inc()
	if !errors.Is(err, ErrStoreDown) {
		l.log.Warn("limit store failed; applying failure policy", "policy", onErr, "err", err)
	}
	switch onErr {
	case policy.FailClosed:
		return batch{degraded: onErr, unavailable: true}, nil
	case policy.FailLocal:
		if u, out := l.quotaUsedUp(meter, cost); out {
			// The quota as the store would decide it, on what this
			// instance knows of the meter; the rules are not charged,
			// as the store charges none on a quota denial.
			return batch{d: limit.Decision{}, mr: limit.MeterResult{Usage: u}, metered: true, store: l.local, degraded: onErr}, nil
		}
		if len(tenant.checks) == 0 && len(global.checks) == 0 {
			return batch{d: limit.Decision{Allowed: true}, degraded: onErr}, nil
		}
		// The same rules in process; no meter (its usage waits) and no
		// breaker (its state is in the failed store).
		b, err := l.evaluate(ctx, l.local, limit.Request{Checks: tenant.checks, Global: global.checks, Cost: cost})
		if err != nil {
			l.log.Error("local fallback decision failed", "err", err)
			return batch{degraded: onErr, unavailable: true}, err
		}
		l.countShadow(tenant.checks, b.d)
		l.countShadow(global.checks, b.g)
		b.degraded = onErr
		return b, nil
	default: // open
		return batch{d: limit.Decision{Allowed: true}, degraded: onErr}, nil
	}
}

// countShadow counts and logs each shadow rule of a decision that would have
// denied the request: shadow rules are evaluated, counted and logged, never
// enforced (limit.Combine already ignores them when deciding).
func (l *limiter) countShadow(checks []limit.Check, d limit.Decision) {
	for i, c := range checks {
		if c.Rule.Shadow && i < len(d.Results) && !d.Results[i].Allowed {
			l.stats.ShadowDenials.WithLabelValues(c.Rule.Name).Inc()
			l.log.Info("shadow rule would deny", "rule", c.Rule.Name, "key", c.Key, "admitted", d.Allowed)
		}
	}
}

func (l *limiter) rememberDenial(s limit.GuardedStore, checks []limit.Check, cost int64, d limit.Decision) {
	if l.shared != nil && s == limit.GuardedStore(l.shared) {
		l.denials.remember(checks, cost, d)
	}
}

// releaseLease frees the slots of checks held under lease in s. A failure
// (a timeout, the store breaker open) is tried again in the background
// (retryRelease): left to the lease's expiry, a short outage would hold a
// tenant's slots, and refuse its calls, for a whole lease after the store
// is back.
func (l *limiter) releaseLease(ctx context.Context, s limit.Store, checks []limit.Check, lease string) {
	if s == nil || lease == "" || len(checks) == 0 {
		return
	}
	if err := s.Release(ctx, checks, lease); err != nil {
		l.log.Warn("releasing concurrency slots failed: tried again until their lease expires", "err", err)
		l.retryRelease(s, checks, lease)
	}
}

// maxReleaseRetries bounds the failed releases tried again at once; past it
// a failed release is left to its lease's expiry.
const maxReleaseRetries = 1024

// retryRelease tries to release lease again, 1 s after the failure and
// then twice as long each time (at most 30 s), while the lease would still
// hold the slots (the longest Period of checks' concurrency rules).
// Releasing twice is harmless: a lease released is gone.
func (l *limiter) retryRelease(s limit.Store, checks []limit.Check, lease string) {
	var life time.Duration
	for _, c := range checks {
		if c.Rule.Algorithm == limit.Concurrency {
			life = max(life, c.Rule.Period)
		}
	}
	if life == 0 {
		return
	}
	if l.retrying.Add(1) > maxReleaseRetries {
		l.retrying.Add(-1)
		return
	}
	end := time.Now().Add(life)
	l.retries.Go(func() {
		defer l.retrying.Add(-1)
		for wait := time.Second; time.Now().Add(wait).Before(end); wait = min(2*wait, 30*time.Second) {
			select {
			case <-l.closing:
				return
			case <-time.After(wait):
			}
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			err := s.Release(ctx, checks, lease)
			cancel()
			if err == nil {
				return
			}
		}
	})
}

// admit is decide inside a "mcpgate.admit" span (when a tracer is set and
// the decision goes to the shared store), which records the decision.
func (l *limiter) admit(ctx context.Context, tenant, global ruleSet, meter *limit.Meter, br *limit.BreakerSpec, cost int64, onErr policy.FailurePolicy) verdict {
	if l.tracer == nil || l.shared == nil {
		// In process, a decision is a few microseconds of CPU and no I/O:
		// a span would cost more than it shows. The decision is on the
		// caller's span all the same.
		return l.decide(ctx, tenant, global, meter, br, cost, onErr)
	}
	ctx, span := l.tracer.Start(ctx, "mcpgate.admit")
	v := l.decide(ctx, tenant, global, meter, br, cost, onErr)
	// The details go on the caller's span only: every attribute is paid
	// for again in the export (see docs/benchmarks.md).
	span.SetAttributes(attrDecision.String(v.describe()))
	span.End()
	return v
}

// attrDecision is the admit span's one attribute.
var attrDecision = attribute.Key("mcpgate.decision")

// describe names a verdict's decision: admitted, denied or unavailable.
func (v *verdict) describe() string {
	switch {
	case v.unavailable:
		return "unavailable"
	case v.breakerOpen, v.quota, !v.allowed:
		return "denied"
	}
	return "admitted"
}
