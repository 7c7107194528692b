package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"

	"github.com/mcpgate/mcpgate/policy"
)

// adminEndpoint is one admin endpoint: its method, path pattern and handler.
type adminEndpoint struct {
	method, path string
	h            http.HandlerFunc
}

// adminRoutes registers the admin endpoints, each behind the admin token.
// A known path asked with another method answers 405 with Allow (the
// "/admin/" catch-all of unknown paths matches every method, so net/http's
// own 405 never happens under /admin/); any other path answers 404.
func (g *Gateway) adminRoutes(mux *http.ServeMux) {
	endpoints := []adminEndpoint{
		{http.MethodGet, "/admin/limits", g.adminLimits},
		{http.MethodPost, "/admin/limits/reset", g.adminResetLimits},
		{http.MethodPost, "/admin/reload", g.adminReload},
		{http.MethodGet, "/admin/usage", g.adminUsage},
		{http.MethodPost, "/admin/cache/invalidate", g.adminInvalidate},
		{http.MethodGet, "/admin/breakers", g.adminBreakers},
		{http.MethodDelete, "/admin/breakers/{key}", g.adminResetBreaker},
	}
	allowed := map[string][]string{}
	for _, e := range endpoints {
		mux.HandleFunc(e.method+" "+e.path, g.adminOnly(e.h))
		allowed[e.path] = append(allowed[e.path], e.method)
		if e.method == http.MethodGet {
			allowed[e.path] = append(allowed[e.path], http.MethodHead) // a GET pattern serves HEAD too
		}
	}
	for path, methods := range allowed {
		allow := strings.Join(methods, ", ")
		mux.HandleFunc(path, g.adminOnly(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + r.Method + " not allowed; allowed: " + allow})
		}))
	}
	mux.HandleFunc("/admin/", g.adminOnly(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown admin endpoint"})
	}))
}

// adminOnly answers 401 to a request without the admin bearer token,
// whatever the endpoint or method, and passes the others to h.
func (g *Gateway) adminOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !g.adminAuthorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcpgate-admin"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "admin bearer token required"})
			return
		}
		h(w, r)
	}
}

// maxAdminBody bounds the JSON body of an admin request.
const maxAdminBody = 1 << 20

// errTrailingData refuses an admin body with more than one JSON value.
var errTrailingData = errors.New("data after the JSON value")

// decodeAdminBody reads r's JSON body into v, refusing unknown fields and
// anything but white space after the value, and reports whether it did;
// if not, it answered: 413 for a body over maxAdminBody (as the MCP
// endpoint answers, so that a client can tell an oversized request from a
// malformed one), else 400. A second value is refused rather than
// ignored: the request would apply the first alone, and answer 200.
func decodeAdminBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		err = bodyEnded(dec)
	}
	if err == nil {
		return true
	}
	status := http.StatusBadRequest
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		status = http.StatusRequestEntityTooLarge
	}
	writeJSON(w, status, map[string]string{"error": "body: " + err.Error()})
	return false
}

// bodyEnded returns nil when dec has nothing left but white space,
// errTrailingData when another value or token follows, else the read's
// error (a *http.MaxBytesError past the bound, or a syntax error).
func bodyEnded(dec *json.Decoder) error {
	_, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return errTrailingData
	}
	return err
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ruleView is a rule as the admin API shows it.
type ruleView struct {
	Name      string `json:"name"`
	Per       string `json:"per"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Period    string `json:"period"`
	Burst     int64  `json:"burst,omitempty"`
	Shadow    bool   `json:"shadow,omitempty"`
}

func viewRules(rules []policy.Rule) []ruleView {
	out := make([]ruleView, 0, len(rules))
	for _, r := range rules {
		out = append(out, ruleView{Name: r.Name, Per: string(r.Per), Algorithm: string(r.Algorithm),
			Limit: r.Limit, Period: r.Period.String(), Burst: r.Burst, Shadow: r.Shadow})
	}
	return out
}

// adminLimits shows the rules that apply to a tenant, per tier and per tool
// (the tier of a tenant comes from its tokens, so every tier is listed),
// and under "live" the state of the tenant's counters for one tier (the
// tier parameter, else the default tier), read without charging anything
// (see liveLimits); subject adds that subject's counters.
func (g *Gateway) adminLimits(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tenant, subject := q.Get("tenant"), q.Get("subject")
	if tenant == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "query parameter tenant is required"})
		return
	}
	cfg := g.rt.Load().cfg
	tier, _, _ := cfg.ResolveTier(q.Get("tier"))
	if q.Get("tier") != "" && tier != q.Get("tier") {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unknown tier " + q.Get("tier")})
		return
	}
	live, err := g.liveLimits(r.Context(), tier, tenant, subject)
	if limitStoreFailed(w, err) {
		return
	}
	tiers := make(map[string]any, len(cfg.Tiers))
	for name, t := range cfg.Tiers {
		tiers[name] = map[string]any{"monthly_quota": t.MonthlyQuota, "limits": viewRules(t.Limits)}
	}
	tools := make(map[string]any, len(cfg.Tools))
	for name, t := range cfg.Tools {
		if len(t.Limits) > 0 {
			tools[name] = viewRules(t.Limits)
		}
	}
	upstreams := make(map[string]any, len(cfg.Upstreams))
	for _, u := range cfg.Upstreams {
		if len(u.Limits) > 0 {
			upstreams[u.Name] = viewRules(u.Limits)
		}
	}
	store := "memory"
	if len(g.eng.Stores()) > 1 {
		store = "redis"
		if !g.eng.StoreAvailable() {
			store = "redis (unavailable: decisions follow on_error)"
		}
	}
	body := map[string]any{
		"tenant": tenant, "default_tier": cfg.DefaultTier, "tiers": tiers,
		"tools": tools, "upstreams": upstreams, "global": viewRules(cfg.Global), "store": store,
		"tier": tier, "subject": subject, "live": live,
	}
	if err != nil {
		body["incomplete"] = err.Error() // live lacks counters of tools the config does not list
	}
	writeJSON(w, http.StatusOK, body)
}

func (g *Gateway) adminReload(w http.ResponseWriter, r *http.Request) {
	// First, and whatever the reload's outcome: after a rotation the audit
	// lines must go to the new file even if the new config is refused.
	_ = g.ReopenAudit(r.Context()) // a failure is logged; the old file stays
	if g.reload == nil {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "reload is not available: the gateway was not started from a config file"})
		return
	}
	if err := g.reload(r.Context()); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "reloaded"})
}

// adminUsageTimeout bounds the reads of GET /admin/usage.
const adminUsageTimeout = 5 * time.Second

// adminUsage reports a tenant's usage in a period, the same JSON as
// `mcpgate usage --json`: the live counter where the store holds it (it is
// ahead of the durable total by at most one flush), else the durable total.
// The tier (for the quota) is the tier parameter or the default tier.
func (g *Gateway) adminUsage(w http.ResponseWriter, r *http.Request) {
	if !g.eng.Metered() {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "usage metering is not configured"})
		return
	}
	q := r.URL.Query()
	tenant, period := q.Get("tenant"), q.Get("period")
	if tenant == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "query parameter tenant is required"})
		return
	}
	if err := usage.CheckTenant(tenant); err != nil {
		// A store could read another tenant's item (DynamoDB's encoding
		// replaces invalid UTF-8), and no call of such a tenant is admitted.
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "query parameter tenant: " + err.Error()})
		return
	}
	if period == "" {
		period = usage.Period(g.now())
	}
	if _, err := usage.PeriodEnd(period); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "period: " + err.Error()})
		return
	}
	cfg := g.rt.Load().cfg
	tierName, tier, ok := cfg.ResolveTier(q.Get("tier"))
	if q.Get("tier") != "" && tierName != q.Get("tier") {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unknown tier " + q.Get("tier")})
		return
	}
	if !ok {
		tierName = ""
	}
	// Bounded: a usage store that hangs answers 503 rather than never.
	ctx, cancel := context.WithTimeout(r.Context(), adminUsageTimeout)
	defer cancel()
	u, updated, live, err := g.eng.Usage(ctx, tenant, period)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "usage store: " + err.Error()})
		return
	}
	source := cfg.Usage.Store
	if live {
		source = "live"
	}
	writeJSON(w, http.StatusOK, usage.NewReport(tenant, period, tierName, tier.MonthlyQuota, u, updated, source))
}

// breakerStore is the store holding the loop breakers.
func (g *Gateway) breakerStore() (limit.GuardedStore, bool) {
	return g.eng.Store(), true
}

// breakerView is a breaker as GET /admin/breakers shows it.
type breakerView struct {
	Key       string    `json:"key"`
	Tenant    string    `json:"tenant"`
	Subject   string    `json:"subject"`
	ID        string    `json:"id"`
	Reason    string    `json:"reason"`
	HalfOpen  bool      `json:"half_open"`
	Until     time.Time `json:"until"`
	Cooldown  string    `json:"cooldown"`
	Denials   int64     `json:"consecutive_denials"`
	Failures  int64     `json:"consecutive_failures"`
	Identical int64     `json:"identical_calls"`
}

// adminBreakers lists the open (and half-open) loop breakers.
func (g *Gateway) adminBreakers(w http.ResponseWriter, r *http.Request) {
	gs, ok := g.breakerStore()
	if !ok {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "the limit store keeps no loop breakers"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	out := []breakerView{}
	err := gs.ListBreakers(ctx, func(b limit.BreakerInfo) error {
		out = append(out, breakerView{Key: b.Key, Tenant: b.Tenant, Subject: b.Subject, ID: b.ID, Reason: b.Reason,
			HalfOpen: b.HalfOpen, Until: b.Until.UTC(), Cooldown: b.Cooldown.String(),
			Denials: b.Denials, Failures: b.Failures, Identical: b.Identical})
		return nil
	})
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "limit store: " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"breakers": out})
}

// adminResetBreaker closes a breaker (its key as listed). Other instances
// may answer it as open from their in-process cache for up to a second
// (enforce.BreakerCacheHold) while the limit store answers them; one whose
// store fails before it asked again keeps answering it as open until the
// old cooldown ends, for it cannot tell a reset from a runaway agent.
func (g *Gateway) adminResetBreaker(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	gs, ok := g.breakerStore()
	if !ok {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "the limit store keeps no loop breakers"})
		return
	}
	if !keyspace.IsBreaker(key) {
		// Never handed to the store: on Redis its script would fail on a
		// key of another type (WRONGTYPE, a 503 for a wrong request), or
		// delete a hash that only looks like a breaker's state.
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such breaker: not a breaker key", "key": key})
		return
	}
	found, err := gs.ResetBreaker(r.Context(), key)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "limit store: " + err.Error()})
		return
	}
	g.eng.ForgetBreaker(key)
	if !found {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such breaker", "key": key})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "closed", "key": key})
}

// invalidateRequest is the body of POST /admin/cache/invalidate.
type invalidateRequest struct {
	Tenant string   `json:"tenant"`
	Tags   []string `json:"tags"`
}

// adminInvalidate drops the tenant's cache entries carrying any of tags (and
// the shared entries carrying them, when shared tools are tagged).
func (g *Gateway) adminInvalidate(w http.ResponseWriter, r *http.Request) {
	var req invalidateRequest
	if !decodeAdminBody(w, r, &req) {
		return
	}
	if req.Tenant == "" || len(req.Tags) == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `body needs "tenant" and a non-empty "tags"`})
		return
	}
	n, err := g.eng.Invalidate(r.Context(), req.Tenant, req.Tags)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "cache: " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": req.Tenant, "tags": req.Tags, "invalidated": n})
}
