package enforce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/ident"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
)

// MethodToolsCall is the method of a tool call, the one method that is
// metered, charged against quotas, watched by the loop breaker and cached.
const MethodToolsCall = "tools/call"

// Call is one MCP request to decide.
type Call struct {
	// Tenant, Tier and Subject name the caller (an authenticated
	// principal). Tier "" means the config's default tier.
	Tenant, Tier, Subject string
	// Session is the caller's MCP session id, if any. It keys the loop
	// breaker when breaker.key is "session"; limits never key on it alone.
	Session string
	// Method is the JSON-RPC method; "" means tools/call.
	Method string
	// Name is what the call acts on: the tool of a tools/call; for other
	// methods, the target that per-tool counters count ("prompts/get greet",
	// "resources/read file:///a", or the method itself).
	Name string
	// Arguments are a tools/call's arguments (the breaker's identical-call
	// fingerprint, cache keys and tags).
	Arguments json.RawMessage
	// Cost, when above 0, is a tools/call's cost in the usage meter and the
	// monthly quota, in place of the tool's configured cost (tools.NAME.cost,
	// or its estimate when the cost comes from the result): for an adapter
	// that knows what a call will cost. Rate limits count calls, not cost.
	Cost int64
}

// MethodTarget is the Call.Name of a request other than tools/call: what
// its tenant_tool and subject_tool counters count. It is the method,
// followed by the prompt's name or the resource's URI for prompts/get and
// resources/read ("prompts/get greet"), so that each prompt or resource is
// counted on its own; name is ignored for other methods.
func MethodTarget(method, name string) string {
	switch method {
	case "prompts/get", "resources/read":
		return method + " " + name
	}
	return method
}

func (c Call) method() string {
	if c.Method == "" {
		return MethodToolsCall
	}
	return c.Method
}

// Scopes of denials that no rule's `per` names.
const (
	ScopeQuota   = "quota"
	ScopeBreaker = "breaker"
)

// Names of the rules in denials that are not configured rules.
const (
	BreakerRule = "loop_breaker"
	QuotaRule   = "monthly_quota"
)

// Decision is the engine's answer to Admit.
type Decision struct {
	// Allowed: the call may run. Otherwise Invalid says the call was
	// refused undecided, Unavailable says the store failed under an
	// on_error: closed policy (answer 503), else Limit and Scope name what
	// denied it (answer 429, see Denial).
	Allowed     bool
	Unavailable bool
	// Invalid, when not nil, wraps ErrInvalidTenant: the call names a
	// tenant that cannot be metered or billed, so it was refused before
	// anything was counted or charged. It is a bad caller (or a bad
	// identity function in an adapter), not a limit: answer it as an
	// authentication failure, never as a 429 or with a retry time.
	Invalid error
	// Limit fills the rate-limit headers: the denying decision, or the
	// most restrictive admitted one. Its Rule is zero when no rule applied
	// or the store failed open. A quota or breaker denial is described as a
	// limit.Decision too (rules QuotaRule and BreakerRule).
	Limit limit.Decision
	// Scope is the denying (or reported) rule's per (global, tenant,
	// tenant_tool, subject, subject_tool), ScopeQuota or ScopeBreaker.
	Scope string
	// Cost is what the call charges its usage meter and quota (the tool's
	// configured cost or estimate; 0 for other methods).
	Cost int64
	// DenyAs is how the call's denial is answered (policy.DenyHTTP or
	// policy.DenyResult); set on denials only.
	DenyAs policy.DenyMode
	// Degraded names the failure policy applied because the store failed
	// ("" when it answered).
	Degraded policy.FailurePolicy
	// FromDenialCache: the denial was answered in process, from an earlier
	// denial by the shared store whose retry time has not come.
	FromDenialCache bool
}

// Denial is what a denied call's answer carries: the JSON-RPC error's data
// of a 429, or the structuredContent of a deny_as: result answer.
type Denial struct {
	Scope             string `json:"scope"`
	Rule              string `json:"rule"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
}

// Denial describes a denied decision for its answer.
func (d Decision) Denial() Denial {
	return Denial{Scope: d.Scope, Rule: d.Limit.Rule.Name, Limit: d.Limit.Limit,
		Remaining: d.Limit.Remaining, RetryAfterSeconds: RetryAfterSeconds(d.Limit)}
}

// Never reports whether a denied call can never be admitted (its cost
// exceeds a rule's capacity).
func (d Decision) Never() bool { return !d.Allowed && d.Limit.RetryAfter == limit.Never }

// Describe names a decision for logs, traces and audit lines: decision is
// "admitted", "denied", "unavailable" or "invalid" (Decision.Invalid); rule
// and scope name the rule that denied it or, for an admission, the one
// reported in headers ("" if none).
func (d Decision) Describe() (decision, rule, scope string) {
	switch {
	case d.Invalid != nil:
		return "invalid", "", ""
	case d.Unavailable:
		return "unavailable", "", ""
	case !d.Allowed:
		return "denied", d.Limit.Rule.Name, d.Scope
	case d.Limit.Rule.Name != "":
		return "admitted", d.Limit.Rule.Name, d.Scope
	}
	return "admitted", "", ""
}

// RetryAfterSeconds is a denial's Retry-After in whole seconds, at least 1.
// A call that can never fit gets the rule's period: retrying sooner cannot
// help, and a client must not spin.
func RetryAfterSeconds(d limit.Decision) int64 {
	ra := d.RetryAfter
	if ra == limit.Never {
		ra = d.Rule.Period
	}
	return max(1, int64(math.Ceil(ra.Seconds())))
}

// ErrInvalidTenant means a Call names a tenant that cannot be metered and
// billed: empty, longer than usage.MaxTenantBytes, not valid UTF-8 or
// holding a control character (usage.CheckTenant), or holding U+FFFD,
// which a decoder makes of invalid input (the rules the gateway's
// authentication applies to the tenant claim). Admit refuses such a call
// with Decision.Invalid wrapping it.
var ErrInvalidTenant = errors.New("enforce: invalid tenant")

// CheckTenant returns nil when tenant can be admitted, else an error
// wrapping ErrInvalidTenant that says why (without quoting the tenant).
func CheckTenant(tenant string) error {
	// usage.CheckTenant is "not empty" and ident.Check, which
	// ident.CheckAdmitted runs with U+FFFD refused: each is run once.
	var err error
	if tenant == "" {
		err = usage.CheckTenant(tenant)
	} else {
		err = ident.CheckAdmitted(tenant, usage.MaxTenantBytes)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTenant, err)
	}
	return nil
}

// Admit decides call. The Ticket is never nil: call its Done once the
// call's work has ended (at once for a denied call; Done is then a no-op).
// Admit never fails: a store failure is answered by the tool's on_error
// policy, which Decision.Degraded names. A call whose tenant fails
// CheckTenant is refused with Decision.Invalid set, whatever its method.
func (e *Engine) Admit(ctx context.Context, call Call) (*Ticket, Decision) {
	cp := e.cfg.Load()
	if err := CheckTenant(call.Tenant); err != nil {
		// Its usage could be stored nowhere, or would be billed with
		// another tenant's (a store's encoding replaces invalid UTF-8):
		// an identity function of an adapter (gosdk) may return any
		// string, and the Engine is the one place every call passes.
		return &Ticket{e: e, cp: cp, call: call, done: true}, Decision{Invalid: err, DenyAs: policy.DenyHTTP}
	}
	if call.method() == MethodToolsCall {
		return e.admitTool(ctx, cp, call)
	}
	return e.admitMethod(ctx, cp, call)
}

// admitTool decides a tools/call: its rules count calls (the config's
// limits are calls per period), its cost goes to the usage meter and the
// monthly quota, the loop breaker watches it.
func (e *Engine) admitTool(ctx context.Context, cp *compiled, call Call) (*Ticket, Decision) {
	cfg := cp.cfg
	owner := keyspace.Owner{Tenant: call.Tenant, Subject: call.Subject, Tool: call.Name}
	tenantRules, globalRules := cfg.RulesFor(call.Tier, call.Name)
	toolCost := cfg.ToolCost(call.Name)
	cost := max(1, toolCost.Charge())
	if call.Cost > 0 {
		cost = min(call.Cost, maxReportedCost)
	}
	now := e.now()
	var meter *limit.Meter
	if e.lim.meters != nil {
		_, tier, _ := cfg.ResolveTier(call.Tier)
		meter = meterFor(call.Tenant, tier.MonthlyQuota, now)
		meter.Cost = cost
	}
	br := breakerSpec(cfg, call, call.Name)
	const callUnits = 1
	v := e.lim.admit(ctx, buildRuleSet(tenantRules, owner), buildRuleSet(globalRules, owner), meter, br, callUnits, cfg.ToolOnError(call.Name))
	d := e.decision(v, meter, br, now)
	d.Cost = cost
	t := &Ticket{e: e, cp: cp, call: call, v: v, meter: meter, br: br, cost: cost}
	if d.Allowed {
		t.charged = cost
	} else {
		d.DenyAs = cfg.DenyAs(call.Tier, call.Name)
		t.done = true
		return t, d
	}
	switch {
	case v.pending && v.opSent:
		// The charge may have landed: placed again with its op, it lands once.
		e.lim.meters.addOp(*meter, pendingOp{op: meter.Op, delta: limit.Usage{Charged: cost, Calls: 1}, sent: time.Now()},
			errors.New("admitted after a meter charge that got no answer"))
	case v.pending:
		e.lim.meters.addPending(*meter, limit.Usage{Charged: cost, Calls: 1}, errors.New("admitted while the meter was unreachable"))
	}
	if meter != nil && toolCost.FromResult != "" {
		t.costPath = toolCost.FromResult
	}
	t.caching = cp.caching[call.Name]
	return t, d
}

// admitMethod decides a request that is not a tools/call: the rules of its
// method (policy.Config.RulesForMethod), with no meter and no breaker,
// under the store's on_error policy. An initialize also takes the session
// slots of its tenant and subject, kept past the call (Ticket.SessionSlots).
func (e *Engine) admitMethod(ctx context.Context, cp *compiled, call Call) (*Ticket, Decision) {
	cfg := cp.cfg
	owner := keyspace.Owner{Tenant: call.Tenant, Subject: call.Subject, Tool: call.Name}
	tr, gr := cfg.RulesForMethod(call.Tier, call.Method)
	tenant, global := buildRuleSet(tr, owner), buildRuleSet(gr, owner)
	if call.Method == policy.MethodInitialize {
		slots := SessionChecks(cfg, call.Tenant, call.Subject)
		tenant.checks = append(tenant.checks, slots...)
		// The contract's scopes are the counters' per: the tenant's cap, then
		// the subject's (SessionChecks' order).
		tenant.per = append(tenant.per, keyspace.PerTenant, keyspace.PerSubject)
		tenant.kept = len(slots)
	}
	v := e.lim.admit(ctx, tenant, global, nil, nil, 1, StoreOnError(cfg))
	d := e.decision(v, nil, nil, e.now())
	d.DenyAs = policy.DenyHTTP
	t := &Ticket{e: e, cp: cp, call: call, v: v, done: !d.Allowed}
	return t, d
}

// StoreOnError is the failure policy of requests that are not tool calls:
// the store's default (open when unset).
func StoreOnError(cfg *policy.Config) policy.FailurePolicy {
	if cfg.Store.OnError != "" {
		return cfg.Store.OnError
	}
	return policy.FailOpen
}

// decision turns the limiter's verdict into a Decision, counting denials.
func (e *Engine) decision(v verdict, meter *limit.Meter, br *limit.BreakerSpec, now time.Time) Decision {
	d := Decision{Allowed: v.allowed, Unavailable: v.unavailable, Limit: v.decision, Scope: string(v.scope),
		Degraded: v.degraded, FromDenialCache: v.fromCache}
	switch {
	case v.unavailable:
		d.Allowed = false
		return d
	case v.breakerOpen:
		d.Allowed, d.Limit, d.Scope = false, breakerDecision(br, v.breaker), ScopeBreaker
	case v.quota:
		d.Allowed, d.Limit, d.Scope = false, quotaDecision(meter, v.usage, now), ScopeQuota
	}
	if !d.Allowed {
		e.metrics.Denials.WithLabelValues(d.Scope, d.Limit.Rule.Name).Inc()
	}
	return d
}

// Status is how an admitted call ended.
type Status int

const (
	// OK: the call answered with a result that is not a tool error.
	OK Status = iota
	// ToolError: the call answered with a tool error (isError: true) or a
	// JSON-RPC error. The loop breaker counts it as a failure.
	ToolError
	// Failed: the call got no answer from its server (a transport error, a
	// timeout, a 5xx). The loop breaker counts it as a failure.
	Failed
	// Cancelled: the caller cancelled the call (notifications/cancelled).
	// It says nothing of the agent; the server may have done the work.
	Cancelled
	// Abandoned: the caller went away before the answer. Like Cancelled.
	Abandoned
)

// Outcome is how an admitted call ended, for Ticket.Done.
type Outcome struct {
	Status Status
	// Result is the call's result (a tools/call result object), for the
	// cost correction of tools whose cost.from_result is set. Nil keeps
	// what Answered recorded, or the estimate.
	Result json.RawMessage
	// Cost, when above 0, is the cost the call reported: the charge in the
	// usage meter is corrected to it (an extra charge or a refund), as
	// cost.from_result does, and in its place. 0 reports nothing (a cost
	// of 0 can be reported through cost.from_result only). Without
	// metering it changes nothing.
	Cost int64
	// Running: the server may still be running the call: its request was
	// cut (a timeout of the caller's) and nothing could stop it (no
	// session to send a notifications/cancelled in). Done then keeps the
	// call's concurrency slots held until their lease lapses by itself
	// (the rule's Period) instead of releasing them, so that cutting a
	// call and calling again never runs more calls at once than the rule
	// allows. Everything else Done does is unchanged.
	Running bool
}

// Ticket is an admitted call's claim on the engine: what Done settles.
// Its methods are safe for concurrent use; Done acts once.
type Ticket struct {
	e        *Engine
	cp       *compiled
	call     Call
	v        verdict
	meter    *limit.Meter
	br       *limit.BreakerSpec
	cost     int64
	costPath string // cost.from_result, "" when the charge is not corrected
	caching  toolCaching

	mu          sync.Mutex
	done        bool
	reported    bool // the breaker was told the outcome
	invalidated bool
	result      json.RawMessage
	// charged is what the call is charged: its cost once admitted (0 when
	// denied), the cost Done settled it at once Done has run.
	charged int64
}

// WantsAnswer reports whether settling the call needs its answer, given
// through Answered or Outcome.Result: for a cost correction, the loop
// breaker, or a mutating tool's invalidations. An adapter that must parse
// the answer to get it can skip that work when this is false.
func (t *Ticket) WantsAnswer() bool {
	return !t.settled() && (t.costPath != "" || t.br != nil || t.caching.invalidates != nil)
}

// settled reports whether Done has run (or the call was denied).
func (t *Ticket) settled() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.done
}

// SessionSlots are the session slots an admitted initialize took and
// keeps past the call (none when none were taken, for example under
// on_error: open). Release them when the upstream opens no session, else
// when the session ends.
func (t *Ticket) SessionSlots() SessionSlots {
	if t.v.lease == "" {
		return SessionSlots{}
	}
	return SessionSlots{e: t.e, store: t.v.leaseStore, lease: t.v.lease, tenant: t.call.Tenant, subject: t.call.Subject}
}

// HoldSlots takes the concurrency slots of the call's rules (its tenant's
// and the global ones that are enforced, as Admit takes them) again, for
// upstream work the call started that outlives it: an early refresh of the
// cache entry its hit read (cache.Refreshing), which would otherwise run
// outside every slot, so that a tenant at its concurrency limit could
// drive any number of loads at once through refreshes. No other rule is
// counted, no meter charged, no breaker asked: the work is the cache's,
// not a call. ok is false when a slot is not free, or the store failed
// under the tool's closed on_error policy: the work must not start. Else
// release frees the slots; call it once the work has ended (each store
// call bounded by a second). Without a concurrency rule nothing is taken.
func (t *Ticket) HoldSlots(ctx context.Context) (release func(context.Context), ok bool) {
	cfg := t.cp.cfg
	owner := keyspace.Owner{Tenant: t.call.Tenant, Subject: t.call.Subject, Tool: t.call.Name}
	tenantRules, globalRules := cfg.RulesFor(t.call.Tier, t.call.Name)
	v := t.e.lim.admit(ctx, buildRuleSet(enforcedSlots(tenantRules), owner), buildRuleSet(enforcedSlots(globalRules), owner),
		nil, nil, 1, cfg.ToolOnError(t.call.Name))
	if !v.allowed || v.unavailable {
		return noRelease, false
	}
	return func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		v.release(rctx)
	}, true
}

// enforcedSlots are the concurrency rules of rules that are not shadow
// rules: the ones whose slots HoldSlots takes.
func enforcedSlots(rules []policy.Rule) []policy.Rule {
	var out []policy.Rule
	for _, r := range rules {
		if r.Algorithm == limit.Concurrency && !r.Shadow {
			out = append(out, r)
		}
	}
	return out
}

// Answered records a tools/call's answer as soon as it is known, before it
// is relayed to the caller: the loop breaker learns the outcome, and a
// mutating tool's invalidations run, so that the caller's next call meets
// the breaker this answer opened and cannot read an entry it made stale.
// failed is a tool error or a JSON-RPC error. When ctx has ended (the
// caller cancelled the call or left, and its answer came all the same),
// the breaker learns nothing: a call its client gave up on says nothing of
// the agent's loop (Done gives its probe back). Done follows all the same.
func (t *Ticket) Answered(ctx context.Context, result json.RawMessage, failed bool) {
	left := ctx.Err() != nil
	ctx = context.WithoutCancel(ctx)
	t.mu.Lock()
	t.result = result
	report := t.br != nil && !t.reported && !t.done && !left
	invalidate := t.caching.invalidates != nil && !t.invalidated && !failed && !t.done
	t.reported = t.reported || report
	t.invalidated = t.invalidated || invalidate
	t.mu.Unlock()
	if report {
		t.e.reportOutcome(ctx, t.br, t.v.breaker, failed)
	}
	if invalidate {
		t.e.invalidateAfter(ctx, t.cp, t.call.Tenant, t.caching, t.call.Arguments)
	}
}

// Done settles an admitted call: it releases the call's concurrency slots
// (unless Outcome.Running: they lapse with their lease), corrects its charge from the cost the tool reported, tells the loop
// breaker how it ended (a cancelled or abandoned call gives back a probe
// instead of reporting), and drops the entries a mutating call may have
// made stale (unless it ended in a tool error). It returns the cost the
// call was charged in the end: 0 for a denied call, and, called again, what
// the first Done returned (the estimate while that one is still running).
// Done does not honour ctx's cancellation: it always settles, each store
// call bounded by a second.
func (t *Ticket) Done(ctx context.Context, o Outcome) (charged int64) {
	t.mu.Lock()
	if t.done {
		charged = t.charged
		t.mu.Unlock()
		return charged
	}
	t.done = true
	if o.Result != nil {
		t.result = o.Result
	}
	result, reported, invalidated := t.result, t.reported, t.invalidated
	t.mu.Unlock()

	ctx = context.WithoutCancel(ctx)
	if !o.Running {
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		t.v.release(rctx)
		cancel()
	}
	charged = t.cost
	switch {
	case o.Cost > 0 && t.meter != nil:
		charged = t.e.correctTo(ctx, t.meter, t.v.metered, t.cost, min(o.Cost, maxReportedCost))
	case t.costPath != "" && result != nil:
		charged = t.e.correctCost(ctx, t.meter, t.v.metered, t.cost, t.costPath, result)
	}
	t.mu.Lock()
	t.charged = charged
	t.mu.Unlock()
	abandoned := o.Status == Cancelled || o.Status == Abandoned
	switch {
	case t.br == nil || reported:
	case !abandoned:
		t.e.reportOutcome(ctx, t.br, t.v.breaker, o.Status != OK)
	default:
		// The call says nothing of the agent, and a probe's lease would
		// refuse every call until it ran out.
		t.e.lim.releaseProbe(ctx, t.br, t.v.breaker)
	}
	if t.caching.invalidates != nil && !invalidated && o.Status != ToolError {
		// A call cancelled, abandoned or without an answer (a timeout, a
		// 5xx) may have written all the same: an entry dropped needlessly
		// costs a reload, one kept wrongly serves stale data for its TTL.
		t.e.invalidateAfter(ctx, t.cp, t.call.Tenant, t.caching, t.call.Arguments)
	}
	return charged
}

// reportOutcome tells the breaker how an admitted call ended. Successes are
// reported only when they change something (a probe, or failures to reset:
// seen on admission, or reported since by another call of this process),
// so that a healthy agent costs no extra store call. A failure reported by
// another instance after this call's admission is not known here: across
// instances, overlapping calls count as "consecutive" in the order their
// outcomes reach the store, successes of calls admitted clean excepted.
func (e *Engine) reportOutcome(ctx context.Context, b *limit.BreakerSpec, st limit.BreakerState, failed bool) {
	if failed {
		// Known before the store answers: a success reported meanwhile
		// must reset the count this failure is about to raise.
		e.lim.breakers.markFailing(b)
	} else if !st.Probe && st.Failures == 0 && !e.lim.breakers.hasFailures(b.Key) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	out, err := e.Store().ReportOutcome(ctx, *b, failed, st.Probe)
	if err != nil {
		e.log.Warn("reporting a call's outcome to its loop breaker failed", "key", b.Key, "err", err)
		return
	}
	e.lim.breakers.observe(b, out)
}

// correctCost turns the estimate charged on admission into the cost the
// tool reported in its result (a refund or an extra charge) and returns
// the cost charged in the end. A result without a valid value keeps the
// estimate.
func (e *Engine) correctCost(ctx context.Context, meter *limit.Meter, metered bool, charged int64, path string, result json.RawMessage) int64 {
	actual, err := reportedCost(result, path)
	if err != nil {
		e.metrics.CostCorrections.WithLabelValues("invalid").Inc()
		e.log.Warn("tool result reports no valid cost: the estimate stays charged", "tenant", meter.Tenant, "estimate", charged, "err", err)
		return charged
	}
	return e.correctTo(ctx, meter, metered, charged, actual)
}

// correctTo turns the charge of a metered call into actual (an extra
// charge or a refund) and returns the cost charged in the end: charged
// when the meter could never take the correction (it would pass
// limit.MaxUsage, or its period is over), which is dropped, for the usage
// store then bills the estimate.
func (e *Engine) correctTo(ctx context.Context, meter *limit.Meter, metered bool, charged, actual int64) int64 {
	delta, ok := correction(charged, actual)
	if !ok {
		e.metrics.CostCorrections.WithLabelValues("unchanged").Inc()
		return charged
	}
	if metered {
		if !e.lim.meters.adjust(ctx, *meter, delta) {
			e.metrics.CostCorrections.WithLabelValues("dropped").Inc()
			return charged
		}
	} else {
		e.lim.meters.addPending(*meter, delta, errors.New("correction of a call admitted while the meter was unreachable"))
	}
	e.metrics.CostCorrections.WithLabelValues("applied").Inc()
	return actual
}
