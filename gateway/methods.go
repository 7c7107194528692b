package gateway

import (
	"context"
	"net/http"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// serveMethod governs a POST whose message is not a tools/call. A request
// passes the rules of its method (policy.Config.RulesForMethod) through the
// limiter like a tool call, with no meter and no breaker, under the store's
// on_error policy; a denial gets the same 429 as a tool call. An initialize
// also takes a session slot (see openSession). Notifications and responses
// are forwarded as they are: they expect no answer and carry no work the
// upstream would do for the caller.
func (g *Gateway) serveMethod(w http.ResponseWriter, r *http.Request, rt *runtime, fwd mcp.Forward, p auth.Principal, msg *mcp.Message) {
	class := methodClass(msg)
	if !msg.IsCall() {
		g.forward(w, r, rt, fwd, class)
		return
	}
	tenant, global := methodRuleSets(rt.cfg, p, msg)
	v := g.lim.admit(r.Context(), tenant, global, nil, nil, 1, storeOnError(rt.cfg))
	noteVerdict(r.Context(), v, 0)
	if !g.methodAdmitted(w, msg, class, v) {
		return
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
		v.release(ctx)
		cancel()
	}()
	setRateHeaders(w.Header(), v.decision, g.now())
	if msg.Method == policy.MethodInitialize {
		g.openSession(w, r, rt, fwd, p, v, class)
		return
	}
	g.forward(w, r, rt, fwd, class)
}

// methodRuleSets builds the rule sets of one request: its method's rules,
// and for initialize the session slots of the caller's tenant and subject
// (kept past the call: they are the session's).
func methodRuleSets(cfg *policy.Config, p auth.Principal, msg *mcp.Message) (tenant, global ruleSet) {
	owner := keyspace.Owner{Tenant: p.Tenant, Subject: p.Subject, Tool: methodTarget(msg)}
	tr, gr := cfg.RulesForMethod(p.Tier, msg.Method)
	tenant, global = buildRuleSet(tr, owner), buildRuleSet(gr, owner)
	if msg.Method == policy.MethodInitialize {
		slots := sessionChecks(cfg, p.Tenant, p.Subject)
		tenant.checks = append(tenant.checks, slots...)
		// The contract's scopes are the counters' per: the tenant's cap, then
		// the subject's (sessionChecks' order).
		tenant.per = append(tenant.per, keyspace.PerTenant, keyspace.PerSubject)
		tenant.kept = len(slots)
	}
	return tenant, global
}

// methodTarget is the "tool" of tenant_tool and subject_tool counters for a
// method other than tools/call: the method, followed by the prompt's name or
// the resource's URI for prompts/get and resources/read ("prompts/get
// greet"), so that each prompt or resource is counted on its own.
func methodTarget(msg *mcp.Message) string {
	switch msg.Method {
	case mcp.MethodPromptsGet, mcp.MethodResourcesRead:
		return msg.Method + " " + msg.Name
	}
	return msg.Method
}

// storeOnError is the failure policy of requests that are not tool calls:
// the store's default.
func storeOnError(cfg *policy.Config) policy.FailurePolicy {
	if cfg.Store.OnError != "" {
		return cfg.Store.OnError
	}
	return policy.FailOpen
}

// methodAdmitted answers a request the limiter refused (503 or 429) and
// reports whether it was admitted.
func (g *Gateway) methodAdmitted(w http.ResponseWriter, msg *mcp.Message, class string, v verdict) bool {
	switch {
	case v.unavailable:
		g.metrics.Requests.WithLabelValues(class, "unavailable").Inc()
		w.Header().Set("Retry-After", "1")
		mcp.WriteError(w, http.StatusServiceUnavailable, msg.ID, CodeUnavailable,
			"rate-limit store unavailable and requests fail closed; retry shortly", nil)
		return false
	case !v.allowed:
		g.metrics.Requests.WithLabelValues(class, "denied").Inc()
		g.metrics.Denials.WithLabelValues(string(v.scope), v.decision.Rule.Name).Inc()
		writeDenied(w, msg.ID, v.decision, string(v.scope), g.now())
		return false
	}
	return true
}
