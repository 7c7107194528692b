// Package gosdk runs mcpgate's enforcement engine (package enforce) inside
// an MCP server built with the official Go SDK
// (github.com/modelcontextprotocol/go-sdk): the same rate limits, monthly
// quotas and metering, loop breaker and result cache as the gateway, with no
// gateway in front. Counters are shared with gateways when the engine's
// store is the same Redis.
//
//	engine, _ := enforce.New(stores.EngineOptions()) // see package setup
//	server := mcp.NewServer(impl, nil)
//	server.AddReceivingMiddleware(gosdk.ScopeMiddleware(nil), gosdk.Middleware(engine, nil))
//	server.AddSendingMiddleware(gosdk.SendingMiddleware())
//	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
//		&mcp.StreamableHTTPOptions{SessionTimeout: cfg.Sessions.IdleTimeout})
//	http.Handle("/mcp", gosdk.RequireBearerToken(authenticator, cfg)(gosdk.CancelAbandoned(handler)))
//
// SendingMiddleware is part of the setup whenever a tool has a cache: it
// tells Middleware that a tool handler asked its caller's client something
// (sampling, elicitation, roots) while loading an entry, whose result then
// holds that client's answers and is stored for no one (neither another
// tenant nor another subject of the same tenant may read it). Until a
// SendingMiddleware has been installed in the process, Middleware stores
// no tool result at all.
//
// Set the handler's SessionTimeout (sessions.idle_timeout): without one the
// SDK never ends a session whose client went away without a DELETE (it
// crashed, or just exited), and each such session is kept, with its
// goroutines, for the life of the process. The SDK counts POSTs only: a
// client that only listens on its GET stream would lose its session after
// that long, where the gateway counts an open stream as use;
// examples/sdkserver keeps such a session with KeepAlive, an in-process
// ping that is not charged to the tenant, while the stream is open.
//
// CancelAbandoned lets Middleware cancel, and settle as abandoned, a call
// whose client went away mid-call: the SDK's stateful handler would run it
// to its end, its concurrency slot held. Options.Settling lets a server's
// shutdown wait, before it closes the engine, for the calls Middleware has
// answered but not yet settled (a cached call whose client left while its
// load runs on for the flight).
//
// Middleware admits every request through Engine.Admit and answers a
// denial the way the gateway does (a JSON-RPC error with code -33029 and
// the retry data, or a tool result under deny_as: result); it serves
// cacheable tools through the engine's cache and settles every admitted call
// with Ticket.Done. RequireBearerToken and TokenVerifier authenticate
// callers with mcpgate's JWT verification and put who they are in the SDK's
// auth.TokenInfo, where Middleware's default Options.Identity reads it;
// ScopeMiddleware refuses the tools, prompts and resources outside the
// caller's scopes and hides them from lists.
package gosdk

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// JSON-RPC error codes of the middleware's own answers: the engine's, as
// the gateway answers them (see enforce.CodeRateLimited).
const (
	// CodeRateLimited: denied by a rate limit, the monthly quota or the
	// loop breaker; the error's data is an enforce.Denial.
	CodeRateLimited = enforce.CodeRateLimited
	// CodeUnauthorized: the request names no authenticated caller, or a
	// tenant the engine refuses (enforce.ErrInvalidTenant).
	CodeUnauthorized = enforce.CodeUnauthorized
	// CodeForbidden: a tool, prompt or resource outside the caller's scopes
	// (ScopeMiddleware).
	CodeForbidden = enforce.CodeForbidden
	// CodeUnavailable: the limit store is unavailable and the request's
	// on_error policy is closed.
	CodeUnavailable = enforce.CodeUnavailable
)

// Identity names the caller of a request: the enforce.Call fields that
// counters, quotas and breakers key on.
type Identity struct {
	// Tenant is required: counters and usage are per tenant. A tenant
	// that enforce.CheckTenant refuses (empty, over 256 bytes, not valid
	// UTF-8, holding a control character) refuses the request with
	// CodeUnauthorized.
	Tenant string
	// Tier selects the tier's limits and quota; "" means the config's
	// default tier.
	Tier string
	// Subject is the end user or agent (a JWT's sub); "" is allowed and
	// shares one per-subject counter and breaker for the tenant.
	Subject string
}

// Options configures Middleware. A nil *Options means the zero value.
type Options struct {
	// Identity names the caller of a request. It is asked once per
	// governed request; an error refuses the request with a JSON-RPC error
	// (the error itself when it is a *jsonrpc.Error, else CodeUnauthorized
	// with a message that names no failed check). Nil: TokenIdentity,
	// which reads the auth.TokenInfo that RequireBearerToken (or any
	// verifier calling SetIdentity) put on the request.
	Identity func(ctx context.Context, req mcp.Request) (Identity, error)
	// Settling, when set, counts the requests Middleware admitted and has
	// not yet settled, so that a server's shutdown can wait for them
	// (Settling.Wait) before it closes the engine. Several Middlewares may
	// share one.
	Settling *Settling
}

// Settling counts the admitted requests of the Middlewares whose
// Options.Settling it is that are not yet settled with Ticket.Done. A
// server's http.Server.Shutdown waits for the requests whose client is
// still there; it does not wait for a call answered before it was
// settled: one whose client left (notifications/cancelled, or gone, see
// CancelAbandoned) while its handler runs on, a cached call's own load
// running on for the flight, or a load the cache abandoned at its
// deadline. Closing the engine before those are settled would flush the
// estimate instead of the cost they report, and free their slots in a
// closed store. Wait for them:
//
//	_ = httpServer.Shutdown(ctx)
//	_ = settling.Wait(ctx)
//	_ = engine.Close()
//
// The zero value is ready to use.
type Settling struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while no one waits
}

// add counts a request admitted. A nil *Settling counts nothing.
func (s *Settling) add() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
}

// done counts a request settled.
func (s *Settling) done() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n--; s.n == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// Wait returns nil once no admitted request is left to settle, or ctx's
// error when it ends first. A request admitted while Wait waits is waited
// for too; one admitted after it returned is not.
func (s *Settling) Wait(ctx context.Context) error {
	s.mu.Lock()
	if s.n == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.idle == nil {
		s.idle = make(chan struct{})
	}
	idle := s.idle
	s.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Middleware returns receiving middleware for an mcp.Server that governs
// every request it receives with e:
//
//   - Notifications (notifications/initialized, notifications/cancelled,
//     ...) pass ungoverned: in process they reach no other server, and a
//     refused notification could only be dropped silently. (The gateway,
//     which forwards them to an upstream, counts them under the rules of
//     policy.MethodNotifications.) So does a ping KeepAlive posted: the
//     server's own, not the tenant's.
//   - tools/call is admitted with Name the tool and Arguments its
//     arguments (rate limits, monthly quota and metering, the loop breaker,
//     keyed on the caller and, when breaker.key is session, the SDK's session
//     id). Other requests are admitted with Method set and Name the method,
//     or for prompts/get and resources/read the method followed by the prompt
//     or resource ("prompts/get greet"), as the gateway counts them.
//   - initialize is admitted under its method's rules (default_initialize,
//     10 a minute per tenant, unless a tier names it). The session caps
//     (sessions.max_per_tenant, max_per_subject) are the gateway's count of
//     live upstream sessions: in process the slots an admitted initialize
//     takes are released as soon as it is answered, so they cap concurrent
//     initializes only (and an initialize is refused while gateways sharing
//     the store hold all of the tenant's slots).
//   - A denial is a *jsonrpc.Error with code CodeRateLimited, the
//     denial's message (Decision.Message) and data the enforce.Denial
//     (scope, rule, limit, remaining, retry_after_seconds), as in the
//     gateway's 429 body; a tools/call of a tool or tier with deny_as:
//     result gets instead a *mcp.CallToolResult with IsError set, the text
//     for the model (Decision.Text) and the Denial in Meta under
//     enforce.MetaDenial and as StructuredContent, except for a tool the
//     server lists with an OutputSchema (which the Denial would not
//     match: a client may check it even on an error); the first such
//     denial reads the server's tools/list in process to know them.
//     A store failure under on_error: closed is a *jsonrpc.Error with code
//     CodeUnavailable. The wrapped handler does not run.
//   - An admitted tools/call of a tool with a cache is served through
//     e.Cache(): one call of the wrapped handler per key across concurrent
//     callers (and across processes on a Redis cache), the value the JSON of
//     the *mcp.CallToolResult, an isError result cached as negative. A result
//     asking for input (NeedsInput) is not cached, nor is a call carrying
//     input responses or request state. Errors are never cached. Nor is a
//     result whose handler asked its client something through the context
//     it was given (SendingMiddleware sees it; without one installed no
//     result is stored), nor a denial of the caller the handler relays
//     from an mcpgate-protected upstream (a result with enforce.MetaDenial,
//     or an error with code CodeRateLimited): it goes to the caller whose
//     load got it, and every caller that joined that load runs its own
//     call, as the gateway does.
//   - Every admitted call is settled with Ticket.Answered and Ticket.Done
//     before its answer is returned (but for a cached call answered while
//     the handler of its own load still runs, see below): the status is
//     OK, ToolError (an isError result or an error), Cancelled (the
//     request's context was cancelled, notifications/cancelled) or
//     Abandoned (its client went away, see CancelAbandoned, or it ended
//     otherwise), and the marshalled result goes with it, so
//     cost.from_result corrects the charge. A result served from the cache
//     is charged the estimate.
//   - A cached tool's handler runs on the load's context, not the
//     caller's: it runs on for the flight's other callers when its caller
//     leaves, and it ends at the load deadline, which an uncached call
//     does not have: enforce.CacheLoadTimeout, upstream.max_duration when
//     set, else the longest of upstream.timeout (default 60s),
//     upstreams[].timeout and tools.<name>.timeout, at least 10s. An
//     embedded config without an upstream cannot set it: it is 60s. A
//     handler still running 1s past it is abandoned by the cache: its
//     callers get cache.ErrLoaderAbandoned and nothing is stored. A call
//     answered while its own load's handler runs on (its caller left, or
//     the load was abandoned) is settled when that handler returns,
//     however late, on its result: its concurrency slot stays held for
//     the work it started, as the gateway holds an orphan's. Wait for such
//     calls (Options.Settling) before closing the engine.
//
// The middleware records nothing of its own: the engine meters, counts and
// logs. Add it after any middleware that must see requests before they are
// charged (ScopeMiddleware first: AddReceivingMiddleware(scopes, limits)).
func Middleware(e *enforce.Engine, opts *Options) mcp.Middleware {
	return newMiddleware(e, opts).wrap
}

func newMiddleware(e *enforce.Engine, opts *Options) *middleware {
	m := &middleware{e: e, identity: TokenIdentity, sending: &sendingInstalled}
	if opts != nil && opts.Identity != nil {
		m.identity = opts.Identity
	}
	if opts != nil {
		m.pending = opts.Settling
	}
	return m
}

func (m *middleware) wrap(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if isNotification(method) || isKeepAlive(method, req) {
			return next(ctx, method, req)
		}
		ctx, post, stop := whileConnected(ctx, req)
		defer stop()
		id, err := m.identity(ctx, req)
		if err != nil {
			return nil, unauthenticated(err)
		}
		switch method {
		case enforce.MethodToolsCall:
			return m.toolCall(ctx, post, next, method, req, id)
		case "tools/list":
			res, err := m.request(ctx, next, method, req, id)
			m.learnOutputSchemas(res)
			return res, err
		}
		return m.request(ctx, next, method, req, id)
	}
}

type middleware struct {
	e        *enforce.Engine
	identity func(ctx context.Context, req mcp.Request) (Identity, error)
	outputs  enforce.OutputSchemas // the tools this server listed with an outputSchema
	sending  *atomic.Bool          // set once a SendingMiddleware is installed: sendingInstalled
	pending  *Settling             // Options.Settling; nil: none

	listMu sync.Mutex
	listed atomic.Bool // listTools read the whole list: later denials skip listMu

	settled func(tool string, st enforce.Status) // a test's: told how each admitted tools/call ended
}

// request governs a request that is not a tools/call.
func (m *middleware) request(ctx context.Context, next mcp.MethodHandler, method string, req mcp.Request, id Identity) (mcp.Result, error) {
	t, d := m.e.Admit(ctx, enforce.Call{Tenant: id.Tenant, Tier: id.Tier, Subject: id.Subject,
		Session: sessionID(req), Method: method, Name: methodTarget(method, req)})
	m.pending.add()
	defer m.pending.done() // after Done
	defer t.Done(context.WithoutCancel(ctx), enforce.Outcome{})
	// The session slots of an initialize: not held in process (see
	// Middleware).
	defer t.SessionSlots().Release(context.WithoutCancel(ctx))
	if !d.Allowed {
		return nil, denialError(d)
	}
	return next(ctx, method, req)
}

// toolCall governs a tools/call; post is its POST's context (see
// whileConnected).
func (m *middleware) toolCall(ctx, post context.Context, next mcp.MethodHandler, method string, req mcp.Request, id Identity) (mcp.Result, error) {
	params, _ := req.GetParams().(*mcp.CallToolParamsRaw)
	if params == nil {
		// Not a server's tools/call (the SDK gives every one these
		// params): refused rather than let through ungoverned.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tools/call without params"}
	}
	if err := m.e.CheckArguments(params.Name, params.Arguments); err != nil {
		// As the gateway answers it: a call that cannot be governed is
		// not run.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "params.arguments: " + err.Error()}
	}
	t, d := m.e.Admit(ctx, enforce.Call{Tenant: id.Tenant, Tier: id.Tier, Subject: id.Subject,
		Session: sessionID(req), Name: params.Name, Arguments: params.Arguments})
	if !d.Allowed {
		t.Done(ctx, enforce.Outcome{}) // a no-op for a denied call, by contract
		if !d.Unavailable && d.DenyAs == policy.DenyResult {
			m.listTools(ctx, next, req)
			return deniedResult(d, m.outputs.Declares(params.Name)), nil
		}
		return nil, denialError(d)
	}
	m.pending.add()
	var orphan *ownLoad  // the call's own load, running on: it settles the call
	var refresh *ownLoad // the early refresh its hit started, running under its slots
	defer func() {
		if orphan == nil && refresh == nil {
			// A handler that panics (behind a recovering middleware: the
			// SDK recovers none) still settles its call, its concurrency
			// slot freed and the failure counted; after the Done below
			// this one is a no-op.
			t.Done(context.WithoutCancel(ctx), enforce.Outcome{Status: enforce.Failed})
			m.pending.done()
		}
	}()
	var (
		res    mcp.Result
		err    error
		answer json.RawMessage // the result to settle with; nil: none (or a cache hit)
		failed bool
	)
	if plan, ok := t.CachePlan(); ok && cacheableParams(params) {
		res, answer, failed, orphan, refresh, err = m.cachedCall(ctx, t, next, method, req, plan)
	} else {
		res, err = next(ctx, method, req)
		answer, failed = settled(res, err)
	}
	st := status(ctx, post, failed)
	if m.settled != nil {
		m.settled(params.Name, st)
	}
	sctx := context.WithoutCancel(ctx)
	if st == enforce.OK || st == enforce.ToolError {
		t.Answered(sctx, answer, failed)
	}
	if orphan != nil || refresh != nil {
		// Answered now, settled when the handler of its own load returns,
		// on that load's result, or, a hit, when the refresh it started
		// ends: its slots stay held for that work (see cachedCall).
		go func() {
			defer m.pending.done()
			result := answer
			if orphan != nil {
				<-orphan.done
				result, _ = orphan.outcome()
			} else {
				<-refresh.done
			}
			t.Done(sctx, enforce.Outcome{Status: st, Result: result})
		}()
		return res, err
	}
	t.Done(sctx, enforce.Outcome{Status: st, Result: answer})
	return res, err
}

// settled is what a handler's answer settles a call with: the marshalled
// result and whether it is a failure (an error, or an isError result).
func settled(res mcp.Result, err error) (json.RawMessage, bool) {
	if err != nil {
		return nil, true
	}
	r, ok := res.(*mcp.CallToolResult)
	if !ok || r == nil {
		return nil, false
	}
	b, merr := json.Marshal(r)
	if merr != nil {
		b = nil
	}
	return b, r.IsError
}

// status is how an admitted call ended, for the engine. A call whose
// client went away is Abandoned even when its context was cancelled
// (the SDK's stateless handler under PropagateRequestCancellation runs it
// on the POST's context): the client did not ask.
func status(ctx, post context.Context, failed bool) enforce.Status {
	switch {
	case ctx.Err() != nil && !clientGone(post) && errors.Is(context.Cause(ctx), context.Canceled):
		return enforce.Cancelled
	case ctx.Err() != nil:
		return enforce.Abandoned
	case failed:
		return enforce.ToolError
	}
	return enforce.OK
}

// denialError is a denied request's JSON-RPC error.
func denialError(d enforce.Decision) *jsonrpc.Error {
	if d.Invalid != nil {
		// Options.Identity named a tenant the engine cannot meter: the
		// request names no valid caller. The reason quotes no tenant.
		return &jsonrpc.Error{Code: CodeUnauthorized, Message: "unauthenticated: " + d.Invalid.Error()}
	}
	if d.Unavailable {
		return &jsonrpc.Error{Code: CodeUnavailable,
			Message: "rate-limit store unavailable and this request fails closed; retry shortly"}
	}
	data, _ := json.Marshal(d.Denial()) // a struct of strings and integers
	return &jsonrpc.Error{Code: CodeRateLimited, Message: d.Message(), Data: data}
}

// deniedResult is a denied tools/call's answer under deny_as: result, as
// the gateway's (enforce.Decision.Result): the denial in _meta, and as
// structuredContent unless the tool declares an outputSchema.
func deniedResult(d enforce.Decision, outputSchema bool) *mcp.CallToolResult {
	r := d.Result(outputSchema)
	res := &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: r.Content[0].Text}},
		IsError: true,
		Meta:    mcp.Meta{enforce.MetaDenial: r.Meta.Denial},
	}
	if r.StructuredContent != nil {
		res.StructuredContent = *r.StructuredContent
	}
	return res
}

// learnOutputSchemas records which tools a tools/list answer declared an
// outputSchema for (see deniedResult).
func (m *middleware) learnOutputSchemas(res mcp.Result) {
	list, ok := res.(*mcp.ListToolsResult)
	if !ok || list == nil {
		return
	}
	tools := make(map[string]bool, len(list.Tools))
	for _, t := range list.Tools {
		if t != nil {
			tools[t.Name] = t.OutputSchema != nil
		}
	}
	m.outputs.Learn(tools)
}

// maxListPages bounds the pages listTools reads: a cursor that never ends
// must not hold a denial for ever.
const maxListPages = 100

// listTools learns, once, which of the server's tools declare an
// outputSchema, from its own tools/list asked in process (the handler
// below Middleware, every page): a result-mode denial must know it even
// for a client that never listed the tools here (it listed them before a
// restart, or through another replica), as the gateway learns them at
// start. A tool added later is learnt from the next tools/list that passes.
// A failed listing is tried again at the next denial.
func (m *middleware) listTools(ctx context.Context, next mcp.MethodHandler, req mcp.Request) {
	if m.listed.Load() {
		return
	}
	m.listMu.Lock()
	defer m.listMu.Unlock()
	ss, _ := req.GetSession().(*mcp.ServerSession)
	if m.listed.Load() || ss == nil {
		return
	}
	var cursor string
	for range maxListPages {
		res, err := next(ctx, "tools/list", &mcp.ListToolsRequest{Session: ss, Params: &mcp.ListToolsParams{Cursor: cursor}})
		list, ok := res.(*mcp.ListToolsResult)
		if err != nil || !ok || list == nil {
			return
		}
		m.learnOutputSchemas(list)
		if cursor = list.NextCursor; cursor == "" {
			m.listed.Store(true)
			return
		}
	}
}

// unauthenticated is the answer to a request whose caller Options.Identity
// cannot name.
func unauthenticated(err error) error {
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		return rpcErr
	}
	return &jsonrpc.Error{Code: CodeUnauthorized, Message: "unauthenticated: this server needs a valid bearer token"}
}

// isNotification reports whether method is a notification's.
func isNotification(method string) bool {
	return strings.HasPrefix(method, "notifications/")
}

// methodTarget is the Call.Name of a request other than tools/call
// (enforce.MethodTarget): the prompt's name or the resource's URI counts
// on its own.
func methodTarget(method string, req mcp.Request) string {
	var name string
	switch p := req.GetParams().(type) {
	case *mcp.GetPromptParams:
		if p != nil {
			name = p.Name
		}
	case *mcp.ReadResourceParams:
		if p != nil {
			name = p.URI
		}
	}
	return enforce.MethodTarget(method, name)
}

// sessionID is the request's MCP session id ("" without a session).
func sessionID(req mcp.Request) string {
	switch s := req.GetSession().(type) {
	case nil:
		return ""
	case *mcp.ServerSession:
		if s == nil {
			return ""
		}
	}
	return req.GetSession().ID()
}
