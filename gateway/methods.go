package gateway

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// serveMethod governs a POST whose message is not a tools/call. A request
// passes the rules of its method (policy.Config.RulesForMethod) through the
// engine like a tool call, with no meter and no breaker, under the store's
// on_error policy; a denial gets the same 429 as a tool call. An initialize
// also takes a session slot (see openSession), once the caller's sessions
// lost upstream have been ended or kept (awaitEnds); one sent inside a
// session is refused (400) before anything is counted. Notifications and responses
// pass the rules of policy.MethodNotifications: each reaches the upstream,
// and unbounded they would let a tenant flood it for free.
//
// A request's rules may hold concurrency slots, which must not be free
// while the upstream still works on it: it is forwarded as a tools/call is
// (forwardHeld, stopUpstream), detached without a session and cancelled
// upstream in one when its client left or the gateway cut it. Not a
// subscriptions/listen (a stream, not a call), nor a notification or
// response (no answer is awaited).
func (g *Gateway) serveMethod(x *exchange) {
	class := methodClass(x.msg)
	if x.msg.IsCall() && x.msg.Method == policy.MethodInitialize {
		g.serveInitialize(x, class)
		return
	}
	t, ok := g.admitMethod(x, class)
	if !ok {
		return
	}
	held := x.msg.IsCall()
	if x.msg.Method == mcp.MethodSubscriptionsListen {
		// a notification stream like the GET's: ended on shutdown
		held = false
		ctx, cancel := context.WithCancel(x.r.Context())
		defer cancel()
		defer g.streams.add(cancel)()
		x.r = x.r.WithContext(ctx)
	}
	if answersQuestion(x.msg) {
		// The client answers the upstream's question: a cached load of
		// its session may now hold that answer (askedDuring).
		g.tracker.askedClient(x.r.Header.Get(mcp.HeaderSessionID))
	}
	if x.rt.outputs != nil && x.msg.IsCall() && x.msg.Method == mcp.MethodToolsList {
		x.fwd.answered = x.rt.outputs.onToolsList // which tools declare an outputSchema
	}
	if !held {
		g.forward(x.w, x.r, x.rt, x.fwd, class)
		return
	}
	_, cut := g.forwardHeld(x.w, x.r, x.rt, x.fwd, class, outlivesClient(x.r))
	running := g.stopUpstream(x.r, x.p, x.msg.ID, cut) // before the request is settled
	t.Done(context.WithoutCancel(x.r.Context()), enforce.Outcome{Running: running})
}

// serveInitialize serves an initialize (see serveMethod).
func (g *Gateway) serveInitialize(x *exchange, class string) {
	if x.r.Header.Get(mcp.HeaderSessionID) != "" {
		// MCP: initialize starts a session, and is sent without one. Inside
		// a session it would take a second slot for that same session (the
		// Go SDK answers it 200 with the session's id), which its DELETE
		// never frees.
		g.metrics.Requests.WithLabelValues(class, "bad_request").Inc()
		mcp.WriteError(x.w, http.StatusBadRequest, x.msg.ID, mcp.CodeInvalidRequest,
			"initialize starts a session: send it without Mcp-Session-Id", nil)
		return
	}
	g.tracker.awaitEnds(x.r.Context(), x.p) // a session the caller just lost frees its slot first
	if t, ok := g.admitMethod(x, class); ok {
		g.openSession(x.w, x.r, x.rt, x.fwd, x.p, t, class)
	}
}

// admitMethod puts a message that is not a tools/call through the engine
// (see serveMethod). Refused, it has been answered; admitted, its rate-limit
// headers are set, and its ticket is settled when the exchange ends, unless
// the caller settled it before (Done acts once).
func (g *Gateway) admitMethod(x *exchange, class string) (*enforce.Ticket, bool) {
	msg := x.msg
	method, target := msg.Method, enforce.MethodTarget(msg.Method, msg.Name)
	if !msg.IsCall() {
		method, target = policy.MethodNotifications, policy.MethodNotifications
	}
	t, d := g.eng.Admit(x.r.Context(), enforce.Call{Tenant: x.p.Tenant, Tier: x.p.Tier, Subject: x.p.Subject,
		Method: method, Name: target})
	x.after(func() { t.Done(context.WithoutCancel(x.r.Context()), enforce.Outcome{}) })
	noteDecision(x.r.Context(), d)
	if !g.admitted(x, class, d) {
		return t, false
	}
	setRateHeaders(x.w.Header(), d.Limit, g.now())
	return t, true
}

// admitted answers a request the engine refused (503, or a denial in the
// tool's deny_as form) and reports whether it was admitted. A refused
// notification or response gets the error without an id (it answers
// nothing).
func (g *Gateway) admitted(x *exchange, class string, d enforce.Decision) bool {
	var id json.RawMessage
	if x.msg.IsCall() {
		id = x.msg.ID
	}
	switch {
	case d.Invalid != nil:
		// The JWT's tenant claim passes the same rules (auth), so only a
		// token issued before a rule changed gets here: no caller to admit.
		g.unauthorized(x.w, x.r, d.Invalid) // counts it
		return false
	case d.Unavailable:
		g.metrics.Requests.WithLabelValues(class, "unavailable").Inc()
		x.w.Header().Set("Retry-After", "1")
		mcp.WriteError(x.w, http.StatusServiceUnavailable, id, CodeUnavailable,
			"rate-limit store unavailable and this request fails closed; retry shortly", nil)
		return false
	case !d.Allowed:
		g.metrics.Requests.WithLabelValues(class, "denied").Inc()
		typed := d.DenyAs == policy.DenyResult && x.rt.outputs.declares(x.msg.ToolName)
		writeCallDenied(x.w, d.DenyAs, id, d, typed, g.now())
		return false
	}
	return true
}

// answersQuestion reports whether msg is a client's answer that may hold
// something of the client's: a response, unless its result is empty (a
// ping's answer, which tells nothing).
func answersQuestion(msg *mcp.Message) bool {
	if msg.Kind != mcp.Response {
		return false
	}
	var result map[string]json.RawMessage
	return msg.Error != nil || json.Unmarshal(msg.Result, &result) != nil || len(result) > 0
}
