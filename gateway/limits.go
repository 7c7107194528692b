package gateway

import (
	"context"
	"errors"
	"log/slog"
	"time"

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
		if c.Rule.Name == d.Rule.Name {
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
	release   func(context.Context)
}

// limiter is the limit stage: tenant-scoped rules in one atomic batch, then
// global rules, refunding the tenant batch when a global rule denies.
type limiter struct {
	shared  *guardedStore // nil: in-process only
	local   limit.Store   // the store when shared is nil; else the fallback of on_error: local
	denials *denialCache
	log     *slog.Logger
	stats   *metrics.Metrics
}

func noRelease(context.Context) {}

func (l *limiter) admit(ctx context.Context, tenant, global ruleSet, cost int64, onErr policy.FailurePolicy) verdict {
	v := verdict{allowed: true, release: noRelease}
	if len(tenant.checks) == 0 && len(global.checks) == 0 {
		return v
	}
	var store limit.Store = l.local
	if l.shared != nil {
		store = l.shared
		for _, rs := range []ruleSet{tenant, global} {
			if d, ok := l.denials.lookup(rs.checks, cost); ok {
				l.stats.DenialCacheHits.Inc()
				return verdict{decision: d, scope: rs.scopeOf(d), fromCache: true, release: noRelease}
			}
		}
	}

	var td, gd limit.Decision
	var tStore, gStore limit.Store
	if len(tenant.checks) > 0 {
		d, s, err := l.take(ctx, store, tenant.checks, cost, onErr, &v)
		if err != nil || v.unavailable {
			return v
		}
		td, tStore = d, s
		if s != nil && !d.Allowed {
			l.rememberDenial(s, tenant.checks, cost, d)
			return verdict{decision: d, scope: tenant.scopeOf(d), degraded: v.degraded, release: noRelease}
		}
		if s == l.local {
			store = l.local // the shared store failed: keep this request on one store
		}
	}
	if len(global.checks) > 0 {
		d, s, err := l.take(ctx, store, global.checks, cost, onErr, &v)
		if err != nil || v.unavailable {
			l.refund(tStore, tenant.checks, cost, td.Lease)
			return v
		}
		gd, gStore = d, s
		if s != nil && !d.Allowed {
			l.refund(tStore, tenant.checks, cost, td.Lease)
			l.rememberDenial(s, global.checks, cost, d)
			return verdict{decision: d, scope: global.scopeOf(d), degraded: v.degraded, release: noRelease}
		}
	}

	// Headers describe the most restrictive admitted decision.
	switch {
	case tStore != nil && (gStore == nil || td.Remaining <= gd.Remaining):
		v.decision, v.scope = td, tenant.scopeOf(td)
	case gStore != nil:
		v.decision, v.scope = gd, global.scopeOf(gd)
	}
	if (tStore != nil && td.Lease != "") || (gStore != nil && gd.Lease != "") {
		v.release = func(ctx context.Context) {
			l.releaseLease(ctx, tStore, tenant.checks, td.Lease)
			l.releaseLease(ctx, gStore, global.checks, gd.Lease)
		}
	}
	return v
}

// take runs one batch, applying the failure policy when the shared store
// fails. It returns the store that decided (nil when the call was admitted
// without a decision, under policy open).
func (l *limiter) take(ctx context.Context, store limit.Store, checks []limit.Check, cost int64, onErr policy.FailurePolicy, v *verdict) (limit.Decision, limit.Store, error) {
	start := time.Now()
	d, err := store.Take(ctx, checks, cost)
	l.stats.DecisionSeconds.Observe(time.Since(start).Seconds())
	if err == nil {
		l.countShadow(checks, d)
		return d, store, nil
	}
	if store == l.local || errors.Is(err, limit.ErrInvalidRule) || errors.Is(err, limit.ErrInvalidCost) {
		// The in-process store does not fail for outside reasons: a bug.
		l.log.Error("limit decision failed", "err", err)
		v.allowed, v.unavailable = false, true
		return d, nil, err
	}
	if ctx.Err() != nil {
		// The client went away; whatever we answer, nobody reads it.
		v.allowed, v.unavailable = false, true
		return d, nil, ctx.Err()
	}
	v.degraded = onErr
	l.stats.Degraded.WithLabelValues(string(onErr)).Inc()
	if !errors.Is(err, ErrStoreDown) {
		l.log.Warn("limit store failed; applying failure policy", "policy", onErr, "err", err)
	}
	switch onErr {
	case policy.FailurePolicy("closed"):
		v.allowed, v.unavailable = false, true
		return d, nil, nil
	case policy.FailurePolicy("local"):
		d, err := l.local.Take(ctx, checks, cost)
		if err != nil {
			l.log.Error("local fallback decision failed", "err", err)
			v.allowed, v.unavailable = false, true
			return d, nil, err
		}
		l.countShadow(checks, d)
		return d, l.local, nil
	default: // open
		return limit.Decision{Allowed: true}, nil, nil
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

func (l *limiter) rememberDenial(s limit.Store, checks []limit.Check, cost int64, d limit.Decision) {
	if l.shared != nil && s == limit.Store(l.shared) {
		l.denials.remember(checks, cost, d)
	}
}

// refund gives back a tenant batch whose request a global rule denied.
// A failed refund over-counts by one request; it is logged, not retried (a
// retried refund could give back twice).
func (l *limiter) refund(s limit.Store, checks []limit.Check, cost int64, lease string) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.Refund(ctx, checks, cost, lease); err != nil {
		l.log.Warn("refund failed: the tenant's counters keep this request", "err", err)
	}
}

func (l *limiter) releaseLease(ctx context.Context, s limit.Store, checks []limit.Check, lease string) {
	if s == nil || lease == "" {
		return
	}
	if err := s.Release(ctx, checks, lease); err != nil {
		l.log.Warn("releasing concurrency slots failed: they free themselves when the lease expires", "err", err)
	}
}
