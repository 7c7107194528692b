package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/mcp"
)

// JSON-RPC error codes of the gateway's own answers: the engine's (see
// enforce.CodeRateLimited), with their HTTP statuses.
const (
	CodeRateLimited  = enforce.CodeRateLimited  // 429: rate limit, quota or breaker
	CodeUnauthorized = enforce.CodeUnauthorized // 401: no or bad credentials
	CodeForbidden    = enforce.CodeForbidden    // 403: tool, resource or prompt outside the caller's scopes
	CodeUnavailable  = enforce.CodeUnavailable  // 503: limit store unavailable under a closed policy
)

// releaseTimeout bounds the release of concurrency slots after a call.
const releaseTimeout = time.Second

// exchange is one /mcp request on its way through the stages. Each stage
// reads what the earlier ones set and may end the exchange by answering.
type exchange struct {
	w   http.ResponseWriter
	r   *http.Request
	rt  *runtime       // the configuration in force when the request came
	p   auth.Principal // set by authenticate
	fwd relay          // what forwarding it upstream needs; Body and Msg set by parse
	msg *mcp.Message   // set by parse (POST only)
	// ids is the writer binding the answer's event ids to the caller
	// (bindEventIDs, rewriteEventIDs), kept here to spare each request an
	// allocation.
	ids eventIDWriter
	// cleanups run when the exchange ends, last registered first.
	cleanups []func()
}

// after registers f to run when the exchange ends, before the functions
// registered earlier.
func (x *exchange) after(f func()) { x.cleanups = append(x.cleanups, f) }

func (x *exchange) finish() {
	for i := len(x.cleanups) - 1; i >= 0; i-- {
		x.cleanups[i]()
	}
}

// stage is one step of an /mcp request. It returns false when it has
// answered the request, which ends the exchange.
type stage func(g *Gateway, x *exchange) bool

// stages are the steps of every /mcp request, in order. A POST's message
// is then dispatched by route.
var stages = [...]stage{
	(*Gateway).checkRequest, // headers read once, method allowed: 400, 405
	(*Gateway).authenticate, // JWT → principal: 401
	(*Gateway).capTenant,    // the tenant's requests in progress on this instance: 429
	(*Gateway).bindSession,  // Mcp-Session-Id bound to its caller: 404
	(*Gateway).bindEventIDs, // Last-Event-ID bound to its caller and session: 400
	(*Gateway).serveStream,  // GET and DELETE go upstream (a GET's event ids bound)
	(*Gateway).parse,        // one JSON-RPC message, headers agreeing: 400; event ids bound
	(*Gateway).authorize,    // scopes: 403
}

func (g *Gateway) serveMCP(w http.ResponseWriter, r *http.Request) {
	x := &exchange{w: w, r: r, rt: g.rt.Load()}
	defer x.finish()
	for _, st := range stages {
		if !st(g, x) {
			return
		}
	}
	g.route(x)
}

// checkRequest runs first, before auth: every later stage reads these
// headers, and a repeated or empty one could be read differently upstream.
func (g *Gateway) checkRequest(x *exchange) bool {
	if herr := mcp.CheckRequestHeaders(x.r.Header); herr != nil {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		herr.Respond(x.w)
		return false
	}
	switch x.r.Method {
	case http.MethodPost, http.MethodGet, http.MethodDelete:
		return true
	}
	x.w.Header().Set("Allow", "GET, POST, DELETE")
	mcp.WriteError(x.w, http.StatusMethodNotAllowed, nil, mcp.CodeInvalidRequest, "method not allowed: use POST, GET or DELETE", nil)
	return false
}

// authenticate verifies the caller's token and prepares what forwarding
// needs of the caller: identity headers, session ids bound to the caller,
// and the list filters of a resumed stream (a replayed list answer is
// filtered as its POST's was).
func (g *Gateway) authenticate(x *exchange) bool {
	p, err := x.rt.auth.FromRequest(x.r.Context(), x.r)
	if err != nil {
		g.unauthorized(x.w, x.r, err)
		return false
	}
	x.p = p
	x.fwd = relay{Forward: mcp.Forward{Header: g.identityHeaders(x.rt, p), ReplayFilters: listFilters(p.Scopes)},
		session: g.sessions.answer(p, "", "")}
	return true
}

// bindSession maps the client's session id to the upstream's, refusing an
// id the caller did not open, and marks the session in use. An answer
// repeating the session gives the client its id back as it sent it, lease
// included (sessionBinder.answer), on a POST, GET or DELETE alike.
func (g *Gateway) bindSession(x *exchange) bool {
	id := x.r.Header.Get(mcp.HeaderSessionID)
	if id == "" {
		return true
	}
	upstreamID, lease, ok := g.sessions.unwrap(x.p, id)
	if !ok {
		// Not a session this caller opened (or one from before a key
		// change): MCP's answer to an unknown session is 404, which tells
		// the client to start a new one.
		g.metrics.Requests.WithLabelValues("any", "bad_session").Inc()
		mcp.WriteError(x.w, http.StatusNotFound, nil, mcp.CodeInvalidRequest, "session not found", nil)
		return false
	}
	x.r.Header.Set(mcp.HeaderSessionID, upstreamID)
	x.fwd.session = g.sessions.answer(x.p, id, upstreamID) // an answer repeating it keeps the client's lease
	if x.r.Method == http.MethodGet {
		// Recorded as soon as the session is known: a POST the client sent
		// right after this GET must not overtake it upstream.
		accepted := g.order.open(upstreamID)
		x.after(accepted)
		x.fwd.accepted = accepted
	}
	w, done, live := g.useSession(x.w, x.r, x.p, upstreamID, lease)
	if !live {
		return false
	}
	x.w = w
	x.after(func() { done(x.msg) }) // x.msg is set by parse, if it gets that far
	return true
}

// serveStream forwards a GET (the server-initiated stream, ended on
// shutdown) or a DELETE (a session's end): nothing to limit, but the caller
// was authenticated.
func (g *Gateway) serveStream(x *exchange) bool {
	switch x.r.Method {
	case http.MethodPost:
		return true
	case http.MethodGet:
		ctx, cancel := context.WithCancel(x.r.Context())
		defer cancel()
		defer g.streams.add(cancel)()
		x.r = x.r.WithContext(ctx)
		x.rewriteEventIDs()
		if session := x.r.Header.Get(mcp.HeaderSessionID); session != "" {
			// a question out of band: a cached load of the session may
			// get the client's answer (askedDuring)
			x.fwd.AskedClient = func() { g.tracker.askedClient(session) }
		}
	}
	g.forward(x.w, x.r, x.rt, x.fwd, "stream")
	return false
}

// parse reads the body as one JSON-RPC message whose headers agree with
// it, and starts the call's trace attributes and audit line.
func (g *Gateway) parse(x *exchange) bool {
	if cerr := mcp.CheckCharset(x.r.Header); cerr != nil {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		mcp.WriteError(x.w, cerr.HTTPStatus, nil, cerr.Code, cerr.Message, nil)
		return false
	}
	body, perr := readBody(x.w, x.r, x.rt.cfg.Upstream.MaxBodyBytes)
	if perr != nil {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		mcp.WriteError(x.w, perr.HTTPStatus, perr.ID, perr.Code, perr.Message, perr.Data)
		return false
	}
	msg, err := mcp.Parse(body)
	if err != nil {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		writeMCPError(x.w, err)
		return false
	}
	if herr := mcp.CheckHeaders(x.r, msg); herr != nil {
		g.metrics.Requests.WithLabelValues(methodClass(msg), "bad_request").Inc()
		mcp.WriteError(x.w, herr.HTTPStatus, herr.ID, herr.Code, herr.Message, herr.Data)
		return false
	}
	if err := g.eng.CheckArguments(msg.ToolName, msg.Arguments); err != nil {
		g.metrics.Requests.WithLabelValues(methodClass(msg), "bad_request").Inc()
		mcp.WriteError(x.w, http.StatusBadRequest, msg.ID, mcp.CodeInvalidParams, "params.arguments: "+err.Error(), nil)
		return false
	}
	x.fwd.Body, x.fwd.Msg, x.msg = body, msg, msg
	x.rewriteEventIDs()
	g.trace.message(x.r.Context(), x.p, msg)
	var audited func()
	x.w, x.r, audited = g.auditCall(x.w, x.r, x.rt, x.p, msg)
	x.after(audited) // the line of a governed call, once it has ended
	return true
}

// authorize refuses a tool, resource or prompt outside the caller's scopes
// (403) and sets the filters of the lists the caller may see.
func (g *Gateway) authorize(x *exchange) bool {
	filter, ok := g.authorized(x.w, x.r, x.rt, x.p, x.fwd.Msg)
	x.fwd.Filter = filter
	return ok
}

// route dispatches an authorized message: a tool call to serveCall, a
// client's cancellation to its call, anything else to serveMethod.
func (g *Gateway) route(x *exchange) {
	switch x.msg.Method {
	case mcp.MethodToolsCall:
		g.serveCall(x)
	case "notifications/cancelled":
		g.serveCancellation(x)
	default:
		g.serveMethod(x)
	}
}

func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay, class string) int {
	status, _ := g.forwardCut(w, r, rt, fwd, class)
	return status
}

// forwardCut is forward that also reports whether the gateway cut the
// upstream request before its answer (cutUpstream): the upstream may
// still be working on it.
func (g *Gateway) forwardCut(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay, class string) (int, bool) {
	start := time.Now()
	fwd, forwarded := noteForward(r.Context(), fwd)
	status, err := g.serveOrdered(w, r, rt, fwd)
	forwarded(status, err)
	g.metrics.UpstreamSeconds.Observe(time.Since(start).Seconds())
	outcome := "admitted"
	switch {
	case errors.Is(err, mcp.ErrCancelled) || errors.Is(err, mcp.ErrClientGone) || cancelledWhileDetached(w):
		outcome = "cancelled" // the client's doing, not the upstream's
	case err != nil || status >= 500:
		outcome = "upstream_error"
		if err != nil && r.Context().Err() == nil {
			g.log.Warn("upstream call failed", "status", status, "err", err)
		}
	}
	g.metrics.Requests.WithLabelValues(class, outcome).Inc()
	if err != nil && status < 500 && !errors.Is(err, mcp.ErrClientGone) && !errors.Is(err, mcp.ErrCancelled) {
		status = http.StatusBadGateway
	}
	return status, cutUpstream(r, err)
}

// identityHeaders are X-Mcp-Tenant / X-Mcp-Subject when the config asks for
// them, encoded by headerSafe.
func (g *Gateway) identityHeaders(rt *runtime, p auth.Principal) http.Header {
	if !rt.cfg.Upstream.IdentityHeaders {
		return nil
	}
	h := make(http.Header, 2)
	h.Set("X-Mcp-Tenant", headerSafe(p.Tenant))
	h.Set("X-Mcp-Subject", headerSafe(p.Subject))
	return h
}

// headerSafe encodes an identity for a header value. Printable ASCII without
// '%' and without leading or trailing spaces is sent as is. Anything else is
// percent-encoded (url.QueryEscape with spaces as %20, so it decodes with
// url.QueryUnescape or url.PathUnescape): a header value can carry neither
// CR/LF nor arbitrary bytes, and HTTP strips the spaces around a value, which
// would make tenant "acme " arrive upstream as "acme". An encoded value
// always contains '%' and a plain one never does, so the upstream can tell
// them apart.
func headerSafe(s string) string {
	escape := len(s) > 0 && (s[0] == ' ' || s[len(s)-1] == ' ')
	for i := 0; i < len(s) && !escape; i++ {
		escape = s[i] < 0x20 || s[i] > 0x7e || s[i] == '%'
	}
	if !escape {
		return s
	}
	return strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
}

// methodClass bounds the cardinality of the method metric label.
func methodClass(m *mcp.Message) string {
	switch m.Method {
	case "initialize", "tools/list", "tools/call", "ping", "resources/list", "resources/read", "prompts/list", "prompts/get":
		return m.Method
	case "":
		return "response"
	}
	if m.Kind == mcp.Notification {
		return "notification"
	}
	return "other"
}

// writeMCPError writes a parse error from package mcp.
func writeMCPError(w http.ResponseWriter, err error) {
	var e *mcp.Error
	if errors.As(err, &e) {
		mcp.WriteError(w, e.HTTPStatus, e.ID, e.Code, e.Message, e.Data)
		return
	}
	mcp.WriteError(w, http.StatusBadRequest, nil, mcp.CodeInvalidRequest, err.Error(), nil)
}
