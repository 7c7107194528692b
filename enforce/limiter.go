package enforce

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
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
	// was admitted without reaching its meter (a store was down), so its
	// usage must be placed later. unmetered: it was admitted after a meter
	// charge that failed in a way that may have applied it (a timed-out
	// script can run after its deadline): placing its usage again could
	// count it twice, so it is not (see chargeMayHaveApplied).
	metered, pending, unmetered bool
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

// limiter is the limit stage: tenant-scoped rules and the usage meter in one
// atomic batch, then global rules, refunding the tenant batch when a global
// rule denies.
type limiter struct {
	shared   *guardedStore      // nil: in-process only
	local    limit.GuardedStore // the store when shared is nil; else the fallback of on_error: local
	meters   *meterer           // nil: no metering
	breakers *breakerCache
	denials  *denialCache
	log      *slog.Logger
	stats    *metrics.Metrics
	tracer   trace.Tracer // nil: no span
}

func noRelease(context.Context) {}

// batch is what one store call (or the failure policy standing in for it)
// answered for one slot's checks.
type batch struct {
	d limit.Decision
	// store decided d; nil when the call was admitted without a decision
	// (policy open) or could not be decided (unavailable).
	store       limit.GuardedStore
	degraded    policy.FailurePolicy // the failure policy applied, "" when the store answered
	unavailable bool                 // the store failed and the policy is closed (or a bug)
	// For the tenant batch only: the meter's answer; metered, whether it was
	// charged (or, on a denial, evaluated) in the store; unmetered, whether
	// a charge failed in a way that may have applied it; the breaker's state.
	mr          limit.MeterResult
	metered     bool
	unmetered   bool
	breaker     limit.BreakerState
	breakerOpen bool
}

// denied reports whether the batch's store denied the call.
func (b batch) denied() bool { return b.store != nil && !b.d.Allowed }

// decide decides a call (admit is decide in a span): cost is what the call
// charges the rules (one per call), meter.Cost what it charges its usage
// meter and quota.
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
	var t batch
	if len(tenant.checks) > 0 || meter != nil || br != nil {
		var err error
		if t, err = l.takeTenant(ctx, store, tenant.checks, meter, br, cost, onErr); err != nil || t.unavailable {
			return verdict{unavailable: true, degraded: t.degraded, release: noRelease}
		}
		if v, done := l.tenantDenied(t, tenant, meter, cost); done {
			return v
		}
		if t.store == l.local {
			store = l.local // the shared store failed: keep this request on one store
		}
	}
	var g batch
	if len(global.checks) > 0 {
		var err error
		g, err = l.take(ctx, store, global.checks, cost, onErr)
		if err != nil || g.unavailable || g.denied() {
			l.undoTenant(ctx, t, tenant, meter, br, cost)
		}
		if err != nil || g.unavailable {
			return verdict{unavailable: true, degraded: cmp.Or(g.degraded, t.degraded), release: noRelease}
		}
		if g.denied() {
			l.rememberDenial(g.store, global.checks, cost, g.d)
			// The tenant script counted this call as admitted; the breaker
			// must see the denial all the same.
			l.breakers.deniedGlobally(ctx, g.store, br)
			return verdict{decision: g.d, scope: global.scopeOf(g.d), degraded: cmp.Or(g.degraded, t.degraded), release: noRelease}
		}
	}
	return l.admitted(t, g, tenant, global, meter)
}

// answeredLocally answers from what this instance already knows, without
// a store call: an open loop breaker, or a denial the shared store gave
// earlier whose retry time has not come.
func (l *limiter) answeredLocally(ctx context.Context, tenant, global ruleSet, br *limit.BreakerSpec, cost int64) (verdict, bool) {
	if br != nil {
		if bs, ok := l.breakers.lookup(br.Key); ok {
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

// tenantDenied turns a tenant batch that refused the call (open breaker,
// quota, a rule) into its verdict; done is false when it admitted.
func (l *limiter) tenantDenied(t batch, tenant ruleSet, meter *limit.Meter, cost int64) (v verdict, done bool) {
	switch {
	case t.breakerOpen:
		return verdict{breaker: t.breaker, breakerOpen: true, release: noRelease}, true
	case !t.denied():
		if t.metered {
			l.observeQuota(meter, t.mr.Usage)
		}
		return verdict{}, false
	case t.metered && !t.mr.Allowed && t.d.Rule.Name == "":
		l.observeQuota(meter, t.mr.Usage)
		return verdict{quota: true, usage: t.mr.Usage, degraded: t.degraded, release: noRelease}, true
	}
	l.rememberDenial(t.store, tenant.checks, cost, t.d)
	return verdict{decision: t.d, scope: tenant.scopeOf(t.d), degraded: t.degraded, release: noRelease}, true
}

// undoTenant gives back what an admitting tenant batch charged when the
// global batch refused the call: its counters, its meter charge, and the
// breaker's probe (the call will not go; the next one may be the probe).
func (l *limiter) undoTenant(ctx context.Context, t batch, tenant ruleSet, meter *limit.Meter, br *limit.BreakerSpec, cost int64) {
	l.refund(t.store, tenant.checks, cost, t.d)
	if t.metered {
		l.meters.adjust(context.WithoutCancel(ctx), *meter, limit.Usage{Refunded: meter.Cost, RefundedCalls: 1})
	}
	l.releaseProbe(ctx, br, t.breaker)
}

// admitted is the verdict of a call both batches admitted. Headers
// describe the most restrictive admitted decision.
func (l *limiter) admitted(t, g batch, tenant, global ruleSet, meter *limit.Meter) verdict {
	v := verdict{allowed: true, release: noRelease, degraded: cmp.Or(g.degraded, t.degraded),
		metered: t.metered, unmetered: t.unmetered, usage: t.mr.Usage, breaker: t.breaker}
	v.pending = meter != nil && !t.metered && !t.unmetered
	switch {
	case t.store != nil && t.d.Rule.Name != "" && (g.store == nil || t.d.Remaining <= g.d.Remaining):
		v.decision, v.scope = t.d, tenant.scopeOf(t.d)
	case g.store != nil:
		v.decision, v.scope = g.d, global.scopeOf(g.d)
	}
	if tenant.kept > 0 && t.store != nil {
		v.lease, v.leaseStore = t.d.Lease, t.store
	}
	if (t.store != nil && t.d.Lease != "") || (g.store != nil && g.d.Lease != "") {
		v.release = func(ctx context.Context) {
			l.releaseLease(ctx, t.store, tenant.checks[:len(tenant.checks)-tenant.kept], t.d.Lease)
			l.releaseLease(ctx, g.store, global.checks, g.d.Lease)
		}
	}
	return v
}

// takeTenant runs the tenant batch, with the usage meter and the breaker
// when there are. A meter the store lost is seeded from the durable total;
// if that total cannot be read, the checks are decided without the meter
// (the call's usage then waits in process) unless the tool fails closed.
func (l *limiter) takeTenant(ctx context.Context, store limit.GuardedStore, checks []limit.Check, meter *limit.Meter, br *limit.BreakerSpec, cost int64, onErr policy.FailurePolicy) (batch, error) {
	if meter == nil && br == nil {
		return l.take(ctx, store, checks, cost, onErr)
	}
	start := time.Now()
	t, err := l.evaluate(ctx, store, checks, meter, br, cost)
	if err == nil && t.mr.NeedSeed && !t.breakerOpen && meter != nil {
		if serr := l.meters.seed(ctx, meter); serr != nil {
			l.log.Warn("usage meter cannot be rebuilt: the durable total is unreadable", "tenant", meter.Tenant, "period", meter.Period, "err", serr)
			if onErr == policy.FailClosed {
				return batch{unavailable: true}, nil
			}
			return l.take(ctx, store, checks, cost, onErr)
		}
		t, err = l.evaluate(ctx, store, checks, meter, br, cost)
	}
	l.stats.DecisionSeconds.Observe(time.Since(start).Seconds())
	switch {
	case err == nil && t.breakerOpen:
		return t, nil
	case err == nil && !t.mr.NeedSeed:
		l.countShadow(checks, t.d)
		if t.d.Allowed && meter != nil {
			l.meters.charged(meter)
		}
		t.metered = meter != nil
		return t, nil
	case err == nil: // nothing charged
		return l.degrade(ctx, store, checks, cost, onErr, errors.New("usage meter still missing after seeding"))
	}
	unmetered := meter != nil && chargeMayHaveApplied(err)
	b, err := l.degrade(ctx, store, checks, cost, onErr, err)
	b.unmetered = unmetered
	return b, err
}

// chargeMayHaveApplied reports whether a failed write to a meter (TakeMetered,
// Adjust) may have been applied all the same: true for anything but a failure
// known to have happened before the request left — the breaker skipped the
// store, the connection could not be dialled, the arguments were refused. A
// script whose answer timed out or whose connection broke may have run.
//
// Such a write is never replayed, as a timed-out script never is: usage kept
// in process and placed later would be counted twice whenever the first write
// had landed. Its usage is then recorded once or not at all, and each case is
// counted (mcpgate_unmetered_calls_total) and logged.
func chargeMayHaveApplied(err error) bool {
	switch {
	case errors.Is(err, ErrStoreDown), errors.Is(err, limit.ErrInvalidRule), errors.Is(err, limit.ErrInvalidCost),
		errors.Is(err, limit.ErrInvalidMeter), errors.Is(err, limit.ErrMeterExpired), errors.Is(err, limit.ErrUsageOverflow):
		return false
	}
	var op *net.OpError
	return !errors.As(err, &op) || op.Op != "dial"
}

// take runs one batch, applying the failure policy when the shared store
// fails.
func (l *limiter) take(ctx context.Context, store limit.GuardedStore, checks []limit.Check, cost int64, onErr policy.FailurePolicy) (batch, error) {
	if len(checks) == 0 {
		return batch{d: limit.Decision{Allowed: true}}, nil
	}
	start := time.Now()
	d, err := store.Take(ctx, checks, cost)
	l.stats.DecisionSeconds.Observe(time.Since(start).Seconds())
	if err == nil {
		l.countShadow(checks, d)
		return batch{d: d, store: store}, nil
	}
	return l.degrade(ctx, store, checks, cost, onErr, err)
}

// degrade applies the tool's failure policy after store failed with err.
// An error return means the call cannot be decided (a bug, or the client
// went away).
func (l *limiter) degrade(ctx context.Context, store limit.GuardedStore, checks []limit.Check, cost int64, onErr policy.FailurePolicy, err error) (batch, error) {
	if store == l.local || errors.Is(err, limit.ErrInvalidRule) || errors.Is(err, limit.ErrInvalidCost) || errors.Is(err, limit.ErrInvalidMeter) {
		// The in-process store does not fail for outside reasons: a bug.
		l.log.Error("limit decision failed", "err", err)
		return batch{unavailable: true}, err
	}
	if ctx.Err() != nil {
		// The client went away; whatever we answer, nobody reads it.
		return batch{unavailable: true}, ctx.Err()
	}
	l.stats.Degraded.WithLabelValues(string(onErr)).Inc()
	if !errors.Is(err, ErrStoreDown) {
		l.log.Warn("limit store failed; applying failure policy", "policy", onErr, "err", err)
	}
	switch onErr {
	case policy.FailClosed:
		return batch{degraded: onErr, unavailable: true}, nil
	case policy.FailLocal:
		if len(checks) == 0 {
			return batch{d: limit.Decision{Allowed: true}, degraded: onErr}, nil
		}
		d, err := l.local.Take(ctx, checks, cost)
		if err != nil {
			l.log.Error("local fallback decision failed", "err", err)
			return batch{degraded: onErr, unavailable: true}, err
		}
		l.countShadow(checks, d)
		return batch{d: d, store: l.local, degraded: onErr}, nil
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

// refund gives back what the tenant batch d charged, when a later stage
// denied the request: only the checks whose result allowed (a denying shadow
// rule charged nothing and must not be credited). A failed refund
// over-counts by one request; it is logged, not retried (a retried refund
// could give back twice).
func (l *limiter) refund(s limit.GuardedStore, checks []limit.Check, cost int64, d limit.Decision) {
	if s == nil {
		return
	}
	charged := make([]limit.Check, 0, len(checks))
	for i, c := range checks {
		if i < len(d.Results) && d.Results[i].Allowed {
			charged = append(charged, c)
		}
	}
	if len(charged) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.Refund(ctx, charged, cost, d.Lease); err != nil {
		l.log.Warn("refund failed: the tenant's counters keep this request", "err", err)
	}
}

func (l *limiter) releaseLease(ctx context.Context, s limit.Store, checks []limit.Check, lease string) {
	if s == nil || lease == "" || len(checks) == 0 {
		return
	}
	if err := s.Release(ctx, checks, lease); err != nil {
		l.log.Warn("releasing concurrency slots failed: they free themselves when the lease expires", "err", err)
	}
}

// admit is decide inside a "mcpgate.admit" span (when a tracer is set),
// which records the decision.
func (l *limiter) admit(ctx context.Context, tenant, global ruleSet, meter *limit.Meter, br *limit.BreakerSpec, cost int64, onErr policy.FailurePolicy) verdict {
	if l.tracer == nil {
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
