package gateway

import (
	"context"
	"net/http"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// serveMethod governs a POST whose message is not a tools/call. A request
// passes the rules of its method (policy.Config.RulesForMethod) through the
// engine like a tool call, with no meter and no breaker, under the store's
// on_error policy; a denial gets the same 429 as a tool call. An initialize
// also takes a session slot (see openSession). Notifications and responses
// are forwarded as they are: they expect no answer and carry no work the
// upstream would do for the caller.
func (g *Gateway) serveMethod(x *exchange) {
	msg := x.msg
	class := methodClass(msg)
	if !msg.IsCall() {
		g.forward(x.w, x.r, x.rt, x.fwd, class)
		return
	}
	t, d := g.eng.Admit(x.r.Context(), enforce.Call{Tenant: x.p.Tenant, Tier: x.p.Tier, Subject: x.p.Subject,
		Method: msg.Method, Name: enforce.MethodTarget(msg.Method, msg.Name)})
	x.after(func() { t.Done(context.WithoutCancel(x.r.Context()), enforce.Outcome{}) })
	noteDecision(x.r.Context(), d)
	if !g.admitted(x, class, d) {
		return
	}
	setRateHeaders(x.w.Header(), d.Limit, g.now())
	if msg.Method == policy.MethodInitialize {
		g.openSession(x.w, x.r, x.rt, x.fwd, x.p, t, class)
		return
	}
	g.forward(x.w, x.r, x.rt, x.fwd, class)
}

// admitted answers a request the engine refused (503, or a denial in the
// tool's deny_as form) and reports whether it was admitted.
func (g *Gateway) admitted(x *exchange, class string, d enforce.Decision) bool {
	switch {
	case d.Unavailable:
		g.metrics.Requests.WithLabelValues(class, "unavailable").Inc()
		x.w.Header().Set("Retry-After", "1")
		mcp.WriteError(x.w, http.StatusServiceUnavailable, x.msg.ID, CodeUnavailable,
			"rate-limit store unavailable and this request fails closed; retry shortly", nil)
		return false
	case !d.Allowed:
		g.metrics.Requests.WithLabelValues(class, "denied").Inc()
		writeCallDenied(x.w, d.DenyAs, x.msg.ID, d, g.now())
		return false
	}
	return true
}
