package usage

import (
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// Report is a tenant's usage in one period as `mcpgate usage --json` and
// GET /admin/usage show it; its JSON form is a stable interface for scripts.
type Report struct {
	Tenant    string    `json:"tenant"`
	Period    string    `json:"period"`
	PeriodEnd time.Time `json:"period_end"` // first instant after the period (UTC): when the quota resets
	Tier      string    `json:"tier,omitempty"`
	Used      int64     `json:"used"`                // net cost units: charged - refunded
	Quota     int64     `json:"quota"`               // the tier's monthly_quota; 0 means no quota
	Remaining *int64    `json:"remaining,omitempty"` // quota - used, never below 0; absent without a quota
	Calls     int64     `json:"calls"`               // calls that stayed admitted: calls_admitted - refunded_calls
	// The four monotonic totals.
	Charged       int64      `json:"charged"`
	Refunded      int64      `json:"refunded"`
	CallsAdmitted int64      `json:"calls_admitted"`
	RefundedCalls int64      `json:"refunded_calls"`
	UpdatedAt     *time.Time `json:"updated_at,omitempty"` // last raise of the durable totals; absent when nothing was stored
	Found         bool       `json:"found"`                // false: nothing is recorded for the tenant and period
	Store         string     `json:"store"`                // where the figures come from
}

// NewReport builds the Report of u. updated is the durable record's
// UpdatedAt (nil when nothing is stored or the figures are live ones).
func NewReport(tenant, period, tier string, quota int64, u limit.Usage, updated *time.Time, store string) Report {
	end, _ := PeriodEnd(period)
	r := Report{
		Tenant: tenant, Period: period, PeriodEnd: end, Tier: tier, Quota: quota,
		Used: u.Used(), Calls: u.NetCalls(),
		Charged: u.Charged, Refunded: u.Refunded, CallsAdmitted: u.Calls, RefundedCalls: u.RefundedCalls,
		UpdatedAt: updated, Found: updated != nil || u != (limit.Usage{}), Store: store,
	}
	if quota > 0 {
		left := max(0, quota-r.Used)
		r.Remaining = &left
	}
	return r
}
