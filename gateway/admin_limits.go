package gateway

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// adminLimitsTimeout bounds the store calls of the admin limit endpoints.
const adminLimitsTimeout = 5 * time.Second

// liveView is the live state of one counter in GET /admin/limits.
type liveView struct {
	Rule      string `json:"rule"`
	Per       string `json:"per"`
	Tool      string `json:"tool,omitempty"`
	Subject   string `json:"subject,omitempty"`
	Algorithm string `json:"algorithm"`
	// Limit is the capacity (burst for token_bucket and gcra), as in
	// X-RateLimit-Limit.
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// ResetAfterMS is the time until the counter is back to full capacity
	// (window algorithms: until the current window stops counting); Reset
	// is that moment in Unix seconds, rounded up, as in X-RateLimit-Reset.
	ResetAfterMS int64 `json:"reset_after_ms"`
	Reset        int64 `json:"reset"`
	Shadow       bool  `json:"shadow,omitempty"`
}

// liveLimits reads the live state of the tenant's counters for tier (and
// subject, when set) without charging them. An error wrapping
// enforce.ErrCountersIncomplete comes with the counters that were read.
func (g *Gateway) liveLimits(ctx context.Context, tier, tenant, subject string) ([]liveView, error) {
	ctx, cancel := context.WithTimeout(ctx, adminLimitsTimeout)
	defer cancel()
	cs, err := g.eng.Counters(ctx, tier, tenant, subject) // on a failure, no counters
	now := g.now()
	out := make([]liveView, 0, len(cs))
	for _, c := range cs {
		res := c.Result
		out = append(out, liveView{Rule: c.Rule.Name, Per: string(c.Rule.Per), Tool: c.Tool, Subject: c.Subject,
			Algorithm: string(c.Rule.Algorithm), Limit: c.Rule.Capacity(), Remaining: res.Remaining,
			ResetAfterMS: res.ResetAfter.Milliseconds(), Reset: ceilUnix(now.Add(res.ResetAfter)), Shadow: c.Rule.Shadow})
	}
	return out, err
}

// limitStoreFailed answers 503 when err, from the engine's counters, is a
// failure rather than an incomplete listing (enforce.ErrCountersIncomplete,
// which the caller reports in its 200), and reports whether it did.
func limitStoreFailed(w http.ResponseWriter, err error) bool {
	if err == nil || errors.Is(err, enforce.ErrCountersIncomplete) {
		return false
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "limit store: " + err.Error()})
	return true
}

// ceilUnix is t in Unix seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// resetRequest is the body of POST /admin/limits/reset.
type resetRequest struct {
	Tenant  string `json:"tenant"`
	Subject string `json:"subject,omitempty"`
	Tool    string `json:"tool,omitempty"`
}

// adminResetLimits clears rate-limit counters of a tenant (never its usage
// meter, quota or breakers): without subject, the counters per tenant and
// tenant_tool; with subject, that subject's (per subject and
// subject_tool) instead; tool narrows either to that tool's per-tool
// counters. Counters of every tier are cleared (a tenant's tier comes from
// its tokens), in the shared store and in the local fallback store, and
// this instance's denial cache is emptied.
func (g *Gateway) adminResetLimits(w http.ResponseWriter, r *http.Request) {
	var req resetRequest
	if !decodeAdminBody(w, r, &req) {
		return
	}
	if req.Tenant == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `body needs "tenant"`})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminLimitsTimeout)
	defer cancel()
	counters, n, err := g.eng.ResetCounters(ctx, req.Tenant, req.Subject, req.Tool)
	if limitStoreFailed(w, err) {
		return
	}
	g.log.Info("rate-limit counters reset by the admin API", "tenant", req.Tenant, "subject", req.Subject, "tool", req.Tool, "counters", counters, "cleared", n, "incomplete", err)
	body := map[string]any{"tenant": req.Tenant, "subject": req.Subject, "tool": req.Tool, "counters": counters, "cleared": n}
	if err != nil {
		// The counters the config names were reset; some of the others
		// could not be found. Naming the tool reaches those.
		body["incomplete"] = err.Error()
	}
	writeJSON(w, http.StatusOK, body)
}
