package enforce

import (
	"context"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
)

// Names of the session caps in denials and metrics.
const (
	RuleSessionsTenant  = "max_sessions_per_tenant"
	RuleSessionsSubject = "max_sessions_per_subject"
)

// SessionChecks are the two concurrency slots a live session of tenant's
// subject holds: the tenant's cap (sessions.max_per_tenant), then the
// subject's (sessions.max_per_subject). An admitted initialize takes them
// (Ticket.SessionSlots); the session's end frees them (SessionSlots.Release).
func SessionChecks(cfg *policy.Config, tenant, subject string) []limit.Check {
	period := SessionPeriod(cfg.Sessions.IdleTimeout)
	rule := func(name string, n int) limit.Rule {
		return limit.Rule{Name: name, Algorithm: limit.Concurrency, Limit: int64(max(n, 1)), Period: period}
	}
	return []limit.Check{
		{Rule: rule(RuleSessionsTenant, cfg.Sessions.MaxPerTenant), Key: keyspace.TenantSessions(tenant)},
		{Rule: rule(RuleSessionsSubject, cfg.Sessions.MaxPerSubject), Key: keyspace.SubjectSessions(tenant, subject)},
	}
}

// SessionPeriod is idle as a valid lease: whole microseconds within the
// bounds of limit.Rule.
func SessionPeriod(idle time.Duration) time.Duration {
	return min(max(idle.Truncate(time.Microsecond), limit.MinPeriod), limit.MaxPeriod)
}

// SessionSlots are the session slots a live MCP session holds: the
// tenant's and the subject's concurrency slots (SessionChecks) under one
// lease, in the store that took them. An admitted initialize takes them
// (Ticket.SessionSlots); a request that names the session, on any instance
// sharing the store, finds them there (Engine.SessionSlotsOf). Renew keeps
// them while the session is in use, Release frees them when it ends. The
// checks are built from the configuration in force at each call, so a
// reload's sessions settings apply to live sessions. The zero value holds
// nothing: Renew and Held report it not held, Release does nothing. A
// SessionSlots is a value, safe to copy and to use from many goroutines.
type SessionSlots struct {
	e               *Engine
	store           limit.GuardedStore
	lease           string
	tenant, subject string
}

// SessionSlotsOf returns the slots of tenant's subject held under lease in
// the store that decides (the shared store, or the in-process one without
// it): a session whose lease came with a request. An empty lease holds
// nothing.
func (e *Engine) SessionSlotsOf(tenant, subject, lease string) SessionSlots {
	if lease == "" {
		return SessionSlots{}
	}
	return SessionSlots{e: e, store: e.Store(), lease: lease, tenant: tenant, subject: subject}
}

// Lease is the slots' lease, "" for none.
func (s SessionSlots) Lease() string { return s.lease }

// Held reports whether s names slots (a lease); whether the store still
// holds them is Renew's answer.
func (s SessionSlots) Held() bool { return s.lease != "" }

// Portable reports whether the slots are in the store that decides (the
// shared store, or the in-process one without it), where SessionSlotsOf
// finds them again from the lease alone: a session id may then carry the
// lease. Slots taken in the in-process fallback while a shared store is
// down (on_error: local) are not.
func (s SessionSlots) Portable() bool {
	return s.lease != "" && s.store == s.e.Store()
}

// Renew makes the slots last a full sessions.idle_timeout from now. held is
// false when they are gone (released elsewhere, or lapsed during an
// outage): they are not taken again.
func (s SessionSlots) Renew(ctx context.Context) (held bool, err error) {
	return s.renew(ctx, false)
}

// Check reports whether the slots are still held, without extending them
// (a renewal never shortens a lease, and this one asks for the shortest
// period): another instance may be renewing them.
func (s SessionSlots) Check(ctx context.Context) (held bool, err error) {
	return s.renew(ctx, true)
}

func (s SessionSlots) renew(ctx context.Context, shortest bool) (held bool, err error) {
	if s.lease == "" {
		return false, nil
	}
	checks := SessionChecks(s.e.Config(), s.tenant, s.subject)
	if shortest {
		for i := range checks {
			checks[i].Rule.Period = limit.MinPeriod
		}
	}
	return s.store.Renew(ctx, checks, s.lease)
}

// Release frees the slots. A failure is logged: the slots free themselves
// when the lease expires. Releasing twice is harmless.
func (s SessionSlots) Release(ctx context.Context) {
	if s.lease == "" {
		return
	}
	s.e.lim.releaseLease(ctx, s.store, SessionChecks(s.e.Config(), s.tenant, s.subject), s.lease)
}
