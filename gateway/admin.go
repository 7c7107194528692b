package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/mcpgate/mcpgate/policy"
)

func (g *Gateway) adminRoutes(mux *http.ServeMux) {
	admin := func(pattern string, h http.HandlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if !g.adminAuthorized(r) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="mcpgate-admin"`)
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "admin bearer token required"})
				return
			}
			h(w, r)
		})
	}
	admin("GET /admin/limits", g.adminLimits)
	admin("POST /admin/reload", g.adminReload)
	notYet := func(what string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusNotImplemented, map[string]string{"error": what + " is not active in this version"})
		}
	}
	admin("GET /admin/usage", notYet("usage metering"))
	admin("POST /admin/cache/invalidate", notYet("the result cache"))
	admin("GET /admin/breakers", notYet("the loop breaker"))
	admin("DELETE /admin/breakers/{key}", notYet("the loop breaker"))
	admin("/admin/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown admin endpoint"})
	})
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

// adminLimits shows the rules that apply to a tenant, per tier and per tool.
// (The tier of a tenant comes from its tokens, so every tier is listed.)
func (g *Gateway) adminLimits(w http.ResponseWriter, r *http.Request) {
	tenant := r.URL.Query().Get("tenant")
	if tenant == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "query parameter tenant is required"})
		return
	}
	cfg := g.rt.Load().cfg
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
	store := "memory"
	if g.guard != nil {
		store = "redis"
		if !g.guard.Available() {
			store = "redis (unavailable: decisions follow on_error)"
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"tenant": tenant, "default_tier": cfg.DefaultTier, "tiers": tiers,
		"tools": tools, "global": viewRules(cfg.Global), "store": store,
	})
}

func (g *Gateway) adminReload(w http.ResponseWriter, r *http.Request) {
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
