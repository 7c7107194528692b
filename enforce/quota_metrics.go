package enforce

import (
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// observeQuota passes the usage the store answered for meter to the
// exported near-quota tenants (metrics.QuotaUsage), which keeps only those
// close to their quota. A meter without quota takes its tenant out (a
// reload removed the quota); one of a period whose end cannot be computed
// is not exported.
func (l *limiter) observeQuota(meter *limit.Meter, u limit.Usage) {
	switch {
	case meter == nil:
		return
	case meter.Quota <= 0:
		l.stats.TenantQuota.Forget(meter.Tenant)
		return
	}
	end, err := usage.PeriodEnd(meter.Period)
	if err != nil {
		return
	}
	l.stats.TenantQuota.Observe(meter.Tenant, u.Used(), meter.Quota, end)
}
