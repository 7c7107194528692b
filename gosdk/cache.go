package gosdk

// The result cache's side of Middleware: one load per key for concurrent
// callers, and what a load may not store.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
)

// interim is a loader's answer that belongs to the caller whose load got
// it, and is never cached: one asking the caller for input (MCP 2026-07-28
// input_required), one whose handler asked the caller's client
// something, or a denial of the caller that the handler relays (see
// relayedDenial), as a result or as an error (err). answer and failed
// settle the call (answer nil: the estimate is charged).
type interim struct {
	res    mcp.Result
	err    error
	answer json.RawMessage
	failed bool
}

func (*interim) Error() string { return "gosdk: the tool result is its caller's alone: not cached" }

// cachedCall answers a tools/call from the engine's cache, the wrapped
// handler running once per key for all concurrent callers. It returns the
// answer, the result this caller's own load produced (nil on a hit, so
// that a hit is charged the estimate), whether the answer is a failure,
// orphan, and the error to return. orphan is nil unless the call is answered while
// the handler of its own load still runs (its caller left, or the cache
// abandoned the load past its deadline). Such a call is settled only when
// orphan.done is closed, on orphan.outcome, as the gateway settles its
// orphans: its concurrency slot stays held for the work it started, and
// the cost the tool reports is the one charged.
//
// refresh is nil unless the call was a hit whose early refresh (XFetch)
// started before the call was done: the refresh runs its handler under the
// call's concurrency slots, and the call is settled, on its own answer,
// once refresh.done is closed. A refresh starting later takes slots of its
// own (refreshLoad).
func (m *middleware) cachedCall(ctx context.Context, t *enforce.Ticket, next mcp.MethodHandler, method string, req mcp.Request, plan enforce.CachePlan) (_ mcp.Result, _ json.RawMessage, _ bool, orphan, refresh *ownLoad, _ error) {
	// The loader may also run after this call returned (an early refresh a
	// hit started): it writes nothing of this call's but ran, own, claim
	// and hit.
	var ran atomic.Bool
	var gate atomic.Int32 // 1: this caller's loader started; 2: the caller was settled first
	var claim atomic.Int32
	own := &ownLoad{done: make(chan struct{})}
	hit := &ownLoad{done: make(chan struct{})}
	entry, _, err := m.e.Cache().Get(ctx, plan.Key, func(lctx context.Context) (b []byte, negative bool, err error) {
		if cache.Refreshing(lctx) {
			return m.refreshLoad(lctx, t, next, method, req, &claim, hit)
		}
		if !gate.CompareAndSwap(0, 1) {
			return nil, false, &interim{} // its caller was settled: the flight's others run their own
		}
		ran.Store(true)
		defer func() { own.end(b, negative || err != nil) }() // a no-op after the end below
		asked, lctx := m.watchClient(lctx)
		res, err := next(lctx, method, req)
		if relayedDenialError(err) {
			return nil, false, &interim{err: err, failed: true}
		}
		if err != nil {
			return nil, false, err
		}
		r, ok := res.(*mcp.CallToolResult)
		if !ok || r == nil {
			return nil, false, errors.New("gosdk: the tool handler returned no *mcp.CallToolResult")
		}
		if r.NeedsInput() || r.InputRequests != nil {
			return nil, false, &interim{res: res}
		}
		b, err = json.Marshal(r)
		if err == nil && (asked.Load() || relayedDenial(r)) {
			// Its client's answers are in it: neither another tenant's
			// nor another subject's to read. Or it denies its caller.
			own.end(b, r.IsError)
			return nil, false, &interim{res: res, answer: b, failed: r.IsError}
		}
		return b, r.IsError, err
	}, plan.Policy)
	var in *interim
	if err != nil && !ran.Load() && !errors.As(err, &in) && !gate.CompareAndSwap(0, 2) {
		ran.Store(true) // the loader started meanwhile: it settles the call
	}
	if err != nil && ran.Load() && !errors.As(err, &in) {
		// This caller's own load failed, or the caller left while it runs
		// on for the flight, or the cache abandoned it at its deadline
		// (cache.ErrLoaderAbandoned) though its handler runs on. The call
		// is settled on the load's result, as the gateway does: when its
		// handler has returned, however late, so that its concurrency
		// slot stays held for the work it started and the cost the tool
		// reports is the one charged.
		if !own.ended() {
			return nil, nil, true, own, nil, err
		}
		result, _ := own.outcome()
		return nil, result, true, nil, nil, err
	}
	if err != nil {
		switch {
		case errors.As(err, &in) && ran.Load():
			return in.res, in.answer, in.failed, nil, nil, in.err
		case errors.As(err, &in):
			// Another caller's load got that caller's own answer (its
			// input asked for, its client's answers, its denial): this
			// caller gets its own.
			res, err := next(ctx, method, req)
			answer, failed := settled(res, err)
			return res, answer, failed, nil, nil, err
		}
		return nil, nil, true, nil, nil, err
	}
	if !claim.CompareAndSwap(loadPending, loadDone) {
		refresh = hit // the refresh this hit started runs under its slots
	}
	var r mcp.CallToolResult
	if err := json.Unmarshal(entry.Value, &r); err != nil {
		return nil, nil, true, nil, refresh, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "gosdk: cached tool result cannot be decoded: " + err.Error()}
	}
	var loaded json.RawMessage
	if ran.Load() {
		loaded = entry.Value // this caller's own load: its reported cost counts
	}
	return &r, loaded, entry.Negative, nil, refresh, nil
}

// The states of a hit's claim on the early refresh it may start
// (cachedCall).
const (
	loadPending int32 = iota // no refresh yet, cachedCall is not done
	loadRefresh              // the refresh runs under the call's slots
	loadDone                 // cachedCall is done: a refresh starting now takes its own
)

// errNoRefreshSlot skips an early refresh that found no concurrency slot
// free.
var errNoRefreshSlot = errors.New("gosdk: early refresh skipped: no concurrency slot free")

// refreshLoad runs an early refresh's handler under concurrency slots:
// those of the hit that started it, when it claims the hit before the hit's
// call is done (the call is then settled once hit.done is closed), or else
// slots of its own, taken as the hit's call took them
// (enforce.Ticket.HoldSlots), the refresh skipped when none is free (the
// entry is served until it expires). Outside them a tenant at its
// concurrency limit could run extra handlers through hits. What it gets
// is stored as a miss's load would be, but nothing of it is the hit's: its
// reported cost is no call's (the cache's work), and a result that is its
// caller's alone is not stored.
func (m *middleware) refreshLoad(ctx context.Context, t *enforce.Ticket, next mcp.MethodHandler, method string, req mcp.Request, claim *atomic.Int32, hit *ownLoad) ([]byte, bool, error) {
	if claim.CompareAndSwap(loadPending, loadRefresh) {
		defer hit.end(nil, false)
	} else {
		release, ok := t.HoldSlots(ctx)
		if !ok {
			return nil, false, errNoRefreshSlot
		}
		defer release(ctx)
	}
	asked, lctx := m.watchClient(ctx)
	res, err := next(lctx, method, req)
	if err != nil {
		return nil, false, err
	}
	r, ok := res.(*mcp.CallToolResult)
	if !ok || r == nil {
		return nil, false, errors.New("gosdk: the tool handler returned no *mcp.CallToolResult")
	}
	if r.NeedsInput() || r.InputRequests != nil || asked.Load() || relayedDenial(r) {
		return nil, false, &interim{res: res}
	}
	b, err := json.Marshal(r)
	return b, r.IsError, err
}

// relayedDenial reports whether r is a denial in mcpgate's deny_as: result
// form (enforce.MetaDenial), which a handler relaying an mcpgate-protected
// upstream, or a Middleware inside this one, returns: it refuses its
// caller (its tenant's limit) until its retryAfter, and as a negative
// entry would reach every caller of the key, another tenant's of a shared
// tool, until negative_ttl. The gateway keeps none either
// (gateway/cache.go, finalResult).
func relayedDenial(r *mcp.CallToolResult) bool {
	_, ok := r.Meta[enforce.MetaDenial]
	return ok
}

// relayedDenialError reports whether err, a handler's, is a denial in
// mcpgate's error form: a JSON-RPC error with code CodeRateLimited, which
// the handler got from an mcpgate-protected upstream it relays (or a
// Middleware inside this one) for its caller. It is that caller's (its
// tenant's limit), not the answer of the key: the flight's other callers,
// another tenant's of a shared tool, make their own calls, as the gateway's
// do when an upstream answers one caller's load with a 429
// (gateway/cache.go, uncacheable.denial).
func relayedDenialError(err error) bool {
	var rpcErr *jsonrpc.Error
	return errors.As(err, &rpcErr) && rpcErr.Code == CodeRateLimited
}

// askedKey is the context key of a load's flag that its handler asked the
// caller's client something (see SendingMiddleware).
type askedKey struct{}

// sendingInstalled is set once a SendingMiddleware is installed on a
// server of the process.
var sendingInstalled atomic.Bool

var warnNoSending sync.Once

// watchClient returns the flag a SendingMiddleware sets when the handler
// running under ctx asks its client something, and ctx carrying it. With
// no SendingMiddleware installed nothing would ever set it: it is set from
// the start, so that no result is stored.
func (m *middleware) watchClient(ctx context.Context) (*atomic.Bool, context.Context) {
	asked := new(atomic.Bool)
	if !m.sending.Load() {
		asked.Store(true)
		warnNoSending.Do(func() {
			slog.Warn("gosdk: no SendingMiddleware is installed (server.AddSendingMiddleware(gosdk.SendingMiddleware())): tool results are not cached")
		})
	}
	return asked, context.WithValue(ctx, askedKey{}, asked)
}

// SendingMiddleware returns sending middleware for an mcp.Server
// (AddSendingMiddleware) that Middleware needs on every server whose tools
// have a cache: it sees a request the server sends its client
// (sampling/createMessage, elicitation/create, roots/list, any but ping)
// on the context of a tool handler loading an entry, so that the result,
// which then holds the client's answers, is not stored for other callers.
// A handler that asks its client on a context other than the one it was
// given is not seen.
//
// Until one has been installed on a server of the process, Middleware
// stores no result: it cannot otherwise know that the results it would
// store asked no client. That check is the process's, not the server's: a
// server of a process whose other servers install one, and which does
// not, stores what its handlers' clients answered.
func SendingMiddleware() mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		sendingInstalled.Store(true) // AddSendingMiddleware wraps as it installs
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if asked, ok := ctx.Value(askedKey{}).(*atomic.Bool); ok && method != "ping" && !isNotification(method) {
				asked.Store(true)
			}
			return next(ctx, method, req)
		}
	}
}

// ownLoad is the load a caller's own Get started, as the caller sees it
// once it has been answered: the loader may run on for the flight's other
// callers, or abandoned by the cache.
type ownLoad struct {
	done chan struct{} // closed by end: the handler has returned

	mu     sync.Mutex
	result json.RawMessage
	failed bool
}

func (o *ownLoad) end(result json.RawMessage, failed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.done:
	default:
		o.result, o.failed = result, failed
		close(o.done)
	}
}

// ended reports whether the load's handler has returned.
func (o *ownLoad) ended() bool {
	select {
	case <-o.done:
		return true
	default:
		return false
	}
}

// outcome is the load's result and whether it failed, once done is closed.
func (o *ownLoad) outcome() (json.RawMessage, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.result, o.failed
}

// cacheableParams reports whether a tools/call's answer can depend on no
// more than its name and arguments: a retry carrying input responses or
// request state (MCP 2026-07-28) goes to the handler.
func cacheableParams(p *mcp.CallToolParamsRaw) bool {
	return len(p.InputResponses) == 0 && p.RequestState == ""
}
