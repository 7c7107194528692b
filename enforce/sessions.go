package enforce

import (
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
// (Ticket.SessionLease); the session's end frees them (Engine.ReleaseLease).
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
