package enforce

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
)

// Counter is the live state of one of a tenant's rate-limit counters, as
// Engine.Counters reads it.
type Counter struct {
	// Rule is the configured rule counting.
	Rule policy.Rule
	// Tool is the tool of a per-tool counter (tenant_tool, subject_tool);
	// Subject the subject of a per-subject one.
	Tool, Subject string
	// Result is the counter as it stands: Remaining and ResetAfter (see
	// limit.Result); Allowed means nothing.
	Result limit.Result
}

// ErrCountersIncomplete means the per-tool counters a store holds for
// tools (prompts, resources) the config does not list could not all be
// found: the store failed to list them, or there were more than
// MaxHeldCounters. Counters and ResetCounters still return, or reset, all
// the others; their error wraps this one and the cause.
var ErrCountersIncomplete = errors.New("enforce: the counters of tools the config does not list were not all found")

// MaxHeldCounters bounds how many counters of tools the config does not
// list Counters and ResetCounters take from one store: a tenant can make
// one per tool, prompt or resource it names, and Counters reads them all
// in one store call.
const MaxHeldCounters = 1000

// Counters reads the live state of tenant's counters under tier (and of
// subject's, when set) without charging them: the rules of tools/call
// (tier and tool rules, per-tool counters for every tool the config lists)
// and of the other methods, from keys the config names; then the per-tool
// counters the store holds for tools (prompts, resources) the config does
// not list, found with limit.CounterLister. An error wrapping
// ErrCountersIncomplete comes with the counters that were found.
func (e *Engine) Counters(ctx context.Context, tier, tenant, subject string) ([]Counter, error) {
	cfg := e.Config()
	f := counterFilter{tenant: tenant, subject: subject, tenantWide: true, subjects: true}
	cs := tenantCounters(cfg, []string{tier}, f)
	held, incomplete := heldCounters(ctx, e.Store(), cfg, []string{tier}, f, cs)
	cs = append(cs, held...)
	out := []Counter{}
	if len(cs) == 0 {
		return out, incomplete
	}
	checks := make([]limit.Check, len(cs))
	for i, c := range cs {
		checks[i] = c.check
	}
	results, err := peek(ctx, e.Store(), tenant, checks)
	if err != nil {
		return nil, err
	}
	for i, c := range cs {
		v := Counter{Rule: c.rule, Tool: c.owner.Tool, Result: results[i]}
		if c.rule.Per == keyspace.PerSubject || c.rule.Per == keyspace.PerSubjectTool {
			v.Subject = subject
		}
		out = append(out, v)
	}
	return out, incomplete
}

// ResetCounters clears rate-limit counters of a tenant (never its usage
// meter, quota or breakers, nor a concurrency rule's slots, which are the
// calls running now): without subject, the counters per tenant and
// tenant_tool; with subject, that subject's (per subject and subject_tool)
// instead; tool narrows either to that name's per-tool counters (of the
// tools/call rules, and of the other methods' rules, whose per-tool
// counters count a prompt or a resource). Counters of every tier are
// cleared (a tenant's tier comes from its tokens), in the shared store and
// in the local fallback store, and this instance's denial cache is
// emptied (other instances' hold a denial for at most DenialCacheHold).
// Per-tool counters are those of the tools the config lists and those the
// store holds for any other tool, prompt or resource (limit.CounterLister).
// It returns how many counters it asked the first store that answered (the
// deciding one, unless it failed) to drop and how many that store held.
// When a store cannot list what it holds, the counters it could name are
// reset all the same and the error wraps ErrCountersIncomplete; when one
// fails (the shared store down), the others are reset all the same and its
// error is returned.
func (e *Engine) ResetCounters(ctx context.Context, tenant, subject, tool string) (counters, cleared int, err error) {
	cfg := e.Config()
	tiers := slices.Sorted(maps.Keys(cfg.Tiers))
	if !slices.Contains(tiers, cfg.DefaultTier) {
		tiers = append(tiers, cfg.DefaultTier)
	}
	f := counterFilter{tenant: tenant, subject: subject, tool: tool, tenantWide: subject == "", subjects: subject != ""}
	cs := tenantCounters(cfg, tiers, f)
	var (
		incomplete, failed error
		reported           bool
	)
	// Every store is reset, the first failing not stopping the others:
	// while the shared store is down, the local fallback's counters are
	// the ones deciding (on_error: local), and an operator must be able to
	// clear them.
	for _, s := range e.Stores() {
		rs, ok := s.(limit.Resetter)
		if !ok {
			return len(cs), 0, fmt.Errorf("%w (%T)", ErrNoReset, s)
		}
		held, herr := heldCounters(ctx, s, cfg, tiers, f, cs)
		incomplete = cmp.Or(incomplete, herr)
		keys := make([]string, 0, len(cs)+len(held))
		for _, c := range slices.Concat(cs, held) {
			if c.rule.Algorithm == limit.Concurrency {
				// It holds the slots of calls running now, not a budget:
				// dropping it would let as many again run at once.
				continue
			}
			keys = append(keys, c.check.Key)
		}
		m, err := rs.Reset(ctx, keys)
		if err != nil {
			failed = cmp.Or(failed, err)
			continue
		}
		if !reported {
			counters, cleared, reported = len(keys), m, true
		}
	}
	e.ForgetDenials()
	return counters, cleared, cmp.Or(failed, incomplete)
}

// heldCounters lists the per-tool counters that store holds for the
// owner f selects and that known (tenantCounters' list) does not name:
// those of tools (and of prompts and resources, for the other methods'
// rules) the config does not list, which only the store can tell. With
// f.tool set nothing is listed: that name's counter is built for every
// per-tool rule. A store that cannot list (not a limit.CounterLister) adds
// nothing. A failed listing, or one past MaxHeldCounters, returns what
// was found with an error wrapping ErrCountersIncomplete.
func heldCounters(ctx context.Context, store limit.Store, cfg *policy.Config, tiers []string, f counterFilter, known []counter) ([]counter, error) {
	var rules []policy.Rule
	for _, r := range perToolRules(cfg, tiers) {
		if r.Per == keyspace.PerSubjectTool && f.subjects && f.subject != "" || r.Per == keyspace.PerTenantTool && f.tenantWide {
			rules = append(rules, r)
		}
	}
	seen := make(map[string]bool, len(known))
	for _, c := range known {
		seen[c.check.Key] = true
	}
	var out []counter
	add := func(r policy.Rule, o keyspace.Owner, key string) bool {
		if seen[key] {
			return true
		}
		if len(out) == MaxHeldCounters {
			return false
		}
		seen[key] = true
		out = append(out, counter{rule: r, owner: o, check: limit.Check{Rule: r.Rule, Key: key}})
		return true
	}
	o := keyspace.Owner{Tenant: f.tenant, Subject: f.subject, Tool: f.tool}
	if f.tool != "" {
		for _, r := range rules {
			add(r, o, keyspace.Counter(r.Per, string(r.Algorithm), r.Name, o))
		}
		return out, nil
	}
	ls, ok := store.(limit.CounterLister)
	if !ok || len(rules) == 0 {
		return nil, nil
	}
	// One listing of all the tenant's counters serves every rule: each
	// rule's are those under its per-tool prefix.
	lctx, cancel := listingContext(ctx)
	held, err := ls.HeldCounters(lctx, keyspace.TenantCounters(f.tenant))
	cancel()
	switch {
	case errors.Is(err, ErrNoHeldCounters):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrCountersIncomplete, err)
	}
	slices.Sort(held) // a stable order for the admin API
	for _, r := range rules {
		prefix := keyspace.ToolCounters(r.Per, string(r.Algorithm), r.Name, o)
		for _, k := range held {
			if !strings.HasPrefix(k, prefix) {
				continue
			}
			o.Tool, _ = keyspace.ToolOf(k) // a digest (a very long name) cannot be read back: shown as ""
			if !add(r, o, k) {
				return out, fmt.Errorf("%w: more than %d", ErrCountersIncomplete, MaxHeldCounters)
			}
		}
	}
	return out, nil
}

// listingTimeout bounds the listing of held counters under a context
// without a deadline.
const listingTimeout = 2 * time.Second

// listingContext gives the listing of held counters half the time left to
// ctx (listingTimeout without a deadline): when a listing runs out of
// time (a large key space, a node that does not answer), the store calls
// that follow it, on the counters the config names, still have the rest.
func listingContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if deadline, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, time.Now().Add(time.Until(deadline)/2))
	}
	return context.WithTimeout(ctx, listingTimeout)
}

// perToolRules are the rules counting per tool (tenant_tool, subject_tool)
// that apply to what the config does not list, under any of tiers: the
// tiers' tools/call rules, every upstream's rules, and the rules of the
// other methods (whose "tool" is the prompt or resource named).
func perToolRules(cfg *policy.Config, tiers []string) []policy.Rule {
	var out []policy.Rule
	seen := map[[3]string]bool{} // what a counter's key names of its rule
	add := func(rs []policy.Rule) {
		for _, r := range rs {
			id := [3]string{string(r.Per), string(r.Algorithm), r.Name}
			if (r.Per == keyspace.PerTenantTool || r.Per == keyspace.PerSubjectTool) && !seen[id] {
				seen[id] = true
				out = append(out, r)
			}
		}
	}
	for _, tier := range tiers {
		rules, _ := cfg.RulesFor(tier, "")
		add(rules)
		for _, m := range policy.GovernedMethods() {
			if m != policy.MethodToolsCall {
				rules, _ := cfg.RulesForMethod(tier, m)
				add(rules)
			}
		}
	}
	for _, u := range cfg.Upstreams {
		add(u.Limits)
	}
	return out
}

// counter is one rate-limit counter of a tenant that the admin API shows or
// resets: a tools/call rule of a tier or a tool, and the key of its counter
// for one owner.
type counter struct {
	rule  policy.Rule
	owner keyspace.Owner // Tool set only for per-tool scopes
	check limit.Check
}

// counterFilter selects the counters tenantCounters returns.
type counterFilter struct {
	tenant, subject string
	// tool, when set, keeps only per-tool counters (tenant_tool,
	// subject_tool) of that tool, which need not be listed in the config.
	tool string
	// tenantWide and subjects select counters per tenant and tenant_tool,
	// and per subject and subject_tool (these need subject).
	tenantWide, subjects bool
}

// tenantCounters lists, without duplicates and in a stable order, the
// counters of the tools/call rules of tiers (tier rules and tool rules) and
// of the other methods' rules (methodCounters) for the owner and scopes f
// selects. Per-tool counters are computed for every tool the config lists
// (or f.tool alone); heldCounters finds the others in the store.
func tenantCounters(cfg *policy.Config, tiers []string, f counterFilter) []counter {
	tools := []string{f.tool}
	if f.tool == "" {
		tools = append(tools, slices.Sorted(maps.Keys(cfg.Tools))...)
	}
	var out []counter
	seen := map[string]bool{}
	add := func(rules []policy.Rule, tool string) {
		for _, r := range rules {
			perTool := r.Per == keyspace.PerTenantTool || r.Per == keyspace.PerSubjectTool
			bySubject := r.Per == keyspace.PerSubject || r.Per == keyspace.PerSubjectTool
			switch {
			case !r.Per.TenantScoped(), perTool && tool == "", f.tool != "" && !perTool,
				bySubject && (!f.subjects || f.subject == ""), !bySubject && !f.tenantWide:
				continue
			}
			o := keyspace.Owner{Tenant: f.tenant, Subject: f.subject}
			if perTool {
				o.Tool = tool
			}
			key := keyspace.Counter(r.Per, string(r.Algorithm), r.Name, o)
			if !seen[key] {
				seen[key] = true
				out = append(out, counter{rule: r, owner: o, check: limit.Check{Rule: r.Rule, Key: key}})
			}
		}
	}
	for _, tier := range tiers {
		for _, tool := range tools {
			rules, _ := cfg.RulesFor(tier, tool)
			add(rules, tool)
		}
		out = append(out, methodCounters(cfg, tier, f, seen)...)
	}
	// An upstream's rules per tenant or subject count every tool of it,
	// listed under tools: or not (their per-tool counters are the store's
	// to name: heldCounters).
	for _, u := range cfg.Upstreams {
		add(u.Limits, "")
	}
	return out
}

// methodCounters are the counters per tenant or per subject of the rules of
// methods other than tools/call, notifications included (the built-in
// default_initialize, default_requests and default_notifications too) in
// tier, skipping keys in seen. Their per-tool
// counters key on the prompt or resource a caller named, which the config
// cannot list: they are left out.
func methodCounters(cfg *policy.Config, tier string, f counterFilter, seen map[string]bool) []counter {
	var out []counter
	for _, m := range policy.GovernedMethods() {
		if m == policy.MethodToolsCall || f.tool != "" {
			continue
		}
		rules, _ := cfg.RulesForMethod(tier, m)
		for _, r := range rules {
			bySubject := r.Per == keyspace.PerSubject
			if (r.Per != keyspace.PerTenant && !bySubject) || (bySubject && (!f.subjects || f.subject == "")) || (!bySubject && !f.tenantWide) {
				continue
			}
			o := keyspace.Owner{Tenant: f.tenant, Subject: f.subject}
			key := keyspace.Counter(r.Per, string(r.Algorithm), r.Name, o)
			if !seen[key] {
				seen[key] = true
				out = append(out, counter{rule: r, owner: o, check: limit.Check{Rule: r.Rule, Key: key}})
			}
		}
	}
	return out
}

// peekRule is the rule of the check peek adds to a batch of concurrency
// checks alone, so that the batch is denied: a fixed window never writes on
// a denial.
var peekRule = limit.Rule{Name: "admin-peek", Algorithm: limit.FixedWindow, Limit: 1, Period: time.Second}

// peek reads the state of checks (all of tenant's) without charging anything:
// one Take whose cost is above every check's capacity. Such a cost is
// denied by every algorithm but concurrency (which counts calls, not
// units) with the counter's Remaining and ResetAfter as they stand, and a
// denied batch charges nothing, concurrency slots included (with
// concurrency checks alone, a check that always denies is added). Shadow
// rules are evaluated as enforced for this, so that they deny too. A
// concurrency result that "allowed" reports one slot fewer than are free
// (it counted the slot it would take) and is corrected; its ResetAfter is
// then an upper bound (the lease period), 0 when no slot is held.
func peek(ctx context.Context, store limit.Store, tenant string, checks []limit.Check) ([]limit.Result, error) {
	batch := make([]limit.Check, 0, len(checks)+1)
	cost, units := int64(0), false
	for _, c := range checks {
		c.Rule.Shadow = false
		batch = append(batch, c)
		cost = max(cost, c.Rule.Capacity())
		units = units || c.Rule.Algorithm != limit.Concurrency
	}
	if !units {
		o := keyspace.Owner{Tenant: tenant} // the checks' slot
		batch = append(batch, limit.Check{Rule: peekRule, Key: keyspace.Counter(keyspace.PerTenant, string(peekRule.Algorithm), peekRule.Name, o)})
		cost = max(cost, peekRule.Capacity())
	}
	d, err := store.Take(ctx, batch, cost+1)
	if err != nil {
		return nil, err
	}
	if d.Allowed { // cannot happen: give back what it took
		_ = store.Refund(ctx, batch, cost+1, d.Lease)
		return nil, errors.New("enforce: reading limits admitted a call")
	}
	out := d.Results[:len(checks)]
	for i, c := range checks {
		if c.Rule.Algorithm == limit.Concurrency && out[i].Allowed {
			out[i].Remaining++
			if out[i].Remaining >= c.Rule.Limit {
				out[i].ResetAfter = 0
			}
		}
	}
	return out, nil
}
