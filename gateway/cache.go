package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/federate"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/mcp"
)

// uncacheable is a loader's answer that is not a cacheable result: a
// JSON-RPC error object, an HTTP failure (5xx, 429, a timeout), or a
// result that came with a non-2xx status. It reaches every caller of the
// flight, each with its own id, and is never stored.
type uncacheable struct {
	status     int
	member     string          // "error" or "result"; "" with value nil
	value      json.RawMessage // nil: no JSON-RPC answer to relay
	retryAfter string          // the upstream's Retry-After (429, 503, a 2xx denial)
	// interim: a 2xx result that is its caller's alone (finalResult): not
	// the call's final answer (MCP 2026-07-28 "input_required": the
	// server asks the client for input and the client calls again with
	// it), or a refusal or denial of that caller.
	interim bool
	// denial: a 429, another 4xx with Retry-After, or a JSON-RPC error
	// with mcpgate's code -33029 (whatever the status): the upstream
	// limiting the loader's caller, whose quota is not another caller's
	// (another tenant's, with a shared tool) to be refused by.
	denial bool
}

func (u *uncacheable) Error() string {
	if u.member == "error" {
		return fmt.Sprintf("upstream answered HTTP %d with a JSON-RPC error", u.status)
	}
	return fmt.Sprintf("upstream answered HTTP %d", u.status)
}

// finalResult reports whether a tools/call result, which came with the
// Retry-After retryAfter, is the call's answer: "resultType" absent or
// "complete", not the federation's refusal (federate.MetaRefusal: the
// upstream could not answer), and not a denial of the caller: mcpgate's
// deny_as: result form (enforce.MetaDenial, from a chained gateway or a
// gosdk middleware upstream), or any isError result with a Retry-After
// (another limiter's). A denial is of its caller (its tenant's limit) and
// ends with its Retry-After; as a negative entry it would reach every
// caller of the key, another tenant's of a shared tool, until
// negative_ttl. Anything else ("input_required") belongs to the caller it
// was sent to and to that moment.
func finalResult(result json.RawMessage, retryAfter string) bool {
	var r struct {
		ResultType string                     `json:"resultType"`
		Meta       map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(result, &r) != nil || (r.ResultType != "" && r.ResultType != "complete") {
		return false
	}
	_, denied := r.Meta[enforce.MetaDenial]
	return string(r.Meta[federate.MetaRefusal]) != "true" && !denied && (retryAfter == "" || !isErrorResult(result))
}

// keyedParams are the members of tools/call params a cache key covers
// (_meta carries a progress token or tracing, not input).
var keyedParams = map[string]bool{"name": true, "arguments": true, "_meta": true}

// cacheableParams reports whether the answer to a tools/call can depend on
// no more than its name and arguments: params with other members (the
// inputResponses and requestState of an MCP 2026-07-28 retry, a task
// request) go to the upstream.
func cacheableParams(params json.RawMessage) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(params, &m) != nil {
		return false
	}
	for k := range m {
		if !keyedParams[k] {
			return false
		}
	}
	return true
}

// load calls the upstream for a cache flight, relaying into lw, and
// returns the JSON-RPC result (from a JSON answer or the final result event
// of a stream) and its isError; anything else is an *uncacheable.
//
// No entry, shared or per-tenant, is stored from a load during which the
// upstream asked a client something (sampling, elicitation, roots): its
// result may hold that client's answers, which are neither another
// tenant's nor another subject's to read (see askedDuring). The caller
// gets it, as an interim result.
//
// A load whose upstream request the gateway cut (upstream.timeout,
// max_duration, or the load's own deadline) may still run upstream: it is
// cancelled there in its session, under the id it went with, before the
// load ends; without one, lw.running tells the call whose slots it runs
// under to keep them until their lease lapses (see stopUpstream).
func (g *Gateway) load(ctx context.Context, r *http.Request, p auth.Principal, rt *runtime, fwd relay, lw *leaderWriter) ([]byte, bool, error) {
	defer lw.finish()
	var result, rpcErr json.RawMessage
	fwd.answered = func(res, e json.RawMessage) {
		result, rpcErr = res, e
		lw.report(res, e)
	}
	var asked atomic.Bool
	fwd.AskedClient = func() { asked.Store(true) }
	askedElsewhere := g.tracker.askedDuring(r.Header.Get(mcp.HeaderSessionID))
	req := r.Clone(ctx)
	_, err := g.serveOrdered(lw, req, rt, fwd)
	if cutUpstream(req, err) || ctx.Err() != nil {
		lw.running.Store(g.stopUpstream(req, p, fwd.Msg.ID, true))
	}
	if askedElsewhere() {
		asked.Store(true)
	}
	status, _, _ := lw.outcome()
	if status == 0 {
		// Nothing written: the proxy gave up (the load's own deadline, as
		// the detached request never goes away otherwise).
		status = http.StatusBadGateway
		if errors.Is(err, mcp.ErrClientGone) || errors.Is(err, mcp.ErrUpstreamTimeout) || ctx.Err() != nil {
			status = http.StatusGatewayTimeout
		}
	}
	u := &uncacheable{status: status, retryAfter: lw.Header().Get("Retry-After")}
	switch {
	case result != nil && status/100 == 2 && finalResult(result, u.retryAfter) && !asked.Load():
		return result, isErrorResult(result), nil
	case result != nil:
		u.member, u.value = "result", result
		u.interim = status/100 == 2
	case rpcErr != nil:
		u.member, u.value = "error", rpcErr
	case status/100 == 2:
		u.status = http.StatusBadGateway // a 2xx without the call's response
	}
	u.denial = u.status == http.StatusTooManyRequests || u.status/100 == 4 && u.retryAfter != "" ||
		u.member == "error" && rateLimitedError(u.value)
	return nil, false, u
}

// rateLimitedError reports whether a JSON-RPC error object has mcpgate's
// rate-limit code: a chained mcpgate in front of the upstream, or a server
// built with the gosdk middleware, which answers its denial in an HTTP 200.
func rateLimitedError(e json.RawMessage) bool {
	var v struct {
		Code int `json:"code"`
	}
	return json.Unmarshal(e, &v) == nil && v.Code == mcp.CodeRateLimited
}

// cachedCall answers a tools/call of a cacheable tool from the cache, the
// upstream being called at most once for all concurrent callers of the
// same key. The caller whose load runs (a miss) gets an event-stream answer
// streamed as it comes, progress and server→client requests included; the
// others get the final result as JSON with their own id. It reports whether
// the answer was an error (for the breaker), the result this caller's own
// load produced (for a cost correction; nil unless this caller's flight
// loaded it), the HTTP status written, and whether its own load, ended, was
// cut and may still run upstream (enforce.Outcome.Running). orphan is nil unless the caller
// left while its own load runs on for the flight: the call is settled only
// when that load ends (orphan.done), on its result (orphan.outcome). A
// load that outlives the call without being its own (an early refresh its
// hit started, or a load starting after it left) is detached, under
// slots of its own (loadHeld). An early refresh its hit started is not run outside the
// tenant's concurrency slots: refresh is nil unless it started before
// cachedCall was done, and then the call is settled (its slots freed) only
// when it ends (refresh.done), on the call's own answer; one that starts
// later takes slots of its own (loadHeld).
//
// A call whose params the key does not cover (cacheableParams) goes to
// bypassCache instead.
func (g *Gateway) cachedCall(w http.ResponseWriter, r *http.Request, p auth.Principal, rt *runtime, fwd relay, t *enforce.Ticket, plan enforce.CachePlan, call *liveCall, answered resultHook) (failed bool, loaded json.RawMessage, status int, running bool, orphan, refresh *leaderWriter) {
	// The loader may also run after this call returned (an early refresh
	// started by a hit, or the flight's load starting after its caller
	// left): it must not touch this call's variables but claim, lw and
	// rw, which are made for it. It runs as this call's own (its id, its
	// answer streamed to it, the call settled when it ends) only when it
	// claims the call before cachedCall is done with it; an early refresh
	// that claims it runs detached under the call's slots.
	var claim atomic.Int32
	lw, rw := newLeaderWriter(w), newLeaderWriter(nil)
	call.cached.Store(true)
	entry, src, err := g.eng.Cache().Get(r.Context(), plan.Key, func(ctx context.Context) ([]byte, bool, error) {
		start := time.Now()
		defer func() { g.metrics.UpstreamSeconds.Observe(time.Since(start).Seconds()) }()
		switch {
		case cache.Refreshing(ctx) && claim.CompareAndSwap(loadPending, loadRefresh):
			return g.loadDetachedTo(ctx, r, p, rt, fwd, rw)
		case cache.Refreshing(ctx):
			return g.loadHeld(ctx, r, p, rt, fwd, t, errNoRefreshSlot)
		case !claim.CompareAndSwap(loadPending, loadOwn):
			// The flight's load starts after its caller left (it waited
			// for a lock held elsewhere, whose load failed): it holds
			// slots of its own, or the flight's other callers make their
			// own calls under theirs.
			return g.loadHeld(ctx, r, p, rt, fwd, t, errNoLoadSlot)
		}
		return g.load(ctx, r, p, rt, fwd, lw)
	}, plan.Policy)
	g.countDegraded(entry)
	switch {
	case lw.release():
		// This caller's own load streams the answer to it: that is its
		// answer, whatever the flight's outcome.
		failed, loaded, status = g.streamedAnswer(r, lw, answered)
	case err != nil:
		failed, loaded, status = g.failedFlightAnswer(w, r, rt, fwd, call, err, claim.Load() == loadOwn)
	default:
		failed, loaded, status = g.entryAnswer(w, r, fwd.Msg, entry, src, answered)
	}
	switch {
	case claim.CompareAndSwap(loadPending, loadDone):
	case claim.Load() == loadRefresh:
		// The early refresh this hit started runs upstream: the call
		// keeps its slots until it ends.
		refresh = rw
	case r.Context().Err() != nil:
		// A caller that left (cancelled, or gone) while its own load runs
		// on for the flight: the call is settled only when that load ends,
		// so that its concurrency slots stay held for the upstream work it
		// started (else cancelling and calling again would run any number
		// of loads at once under a concurrency rule).
		orphan = lw
	}
	// The call's own load has ended (else it is an orphan): whether the
	// gateway cut it and nothing could stop it upstream.
	running = claim.Load() == loadOwn && orphan == nil && lw.running.Load()
	return failed, loaded, status, running, orphan, refresh
}

// The states of a cached call's claim on its loader (cachedCall).
const (
	loadPending int32 = iota // the loader has not run, cachedCall is not done
	loadOwn                  // the loader runs as the call's own
	loadRefresh              // an early refresh the call's hit started runs under its slots
	loadDone                 // cachedCall is done: a load starting now is detached
)

// errNoRefreshSlot skips an early refresh that found no concurrency slot
// free (loadHeld).
var errNoRefreshSlot = errors.New("gateway: early refresh skipped: no concurrency slot free")

// errNoLoadSlot ends a flight's load whose caller left and that found no
// concurrency slot free (loadHeld): a denial of that caller, so that the
// flight's other callers make their own calls (failedFlightAnswer).
var errNoLoadSlot = fmt.Errorf("gateway: a cache load whose caller left found no concurrency slot free: %w",
	&uncacheable{status: http.StatusTooManyRequests, denial: true})

// loadHeld is loadDetachedTo for a load that starts after the call it was
// made for was settled: an early refresh whose hit was answered, or a
// flight's load whose caller left while it waited for a lock held
// elsewhere. It runs under concurrency slots of its own, taken as the
// call took them (enforce.Ticket.HoldSlots), and when none is free it
// does not run and returns noSlot (a refresh is skipped and the entry
// served until it expires; a flight's other callers make their own calls).
// Run outside them, a tenant at its concurrency limit could drive extra
// loads upstream through hits, or by leaving calls that wait for a lock.
func (g *Gateway) loadHeld(ctx context.Context, r *http.Request, p auth.Principal, rt *runtime, fwd relay, t *enforce.Ticket, noSlot error) ([]byte, bool, error) {
	release, ok := t.HoldSlots(ctx)
	if !ok {
		return nil, false, noSlot
	}
	lw := newLeaderWriter(nil)
	defer func() {
		if !lw.running.Load() { // else the slots lapse with their lease
			release(ctx)
		}
	}()
	return g.loadDetachedTo(ctx, r, p, rt, fwd, lw)
}

// loadIDPrefix begins the JSON-RPC id of a detached load's request.
const loadIDPrefix = "mcpgate-load-"

// loadDetachedTo is load for a load that outlives its call: an early
// refresh (which a hit starts after it was answered), or a flight's load
// that starts after its caller left. It goes upstream in the caller's
// session, with its headers and params (_meta included), but under a
// JSON-RPC id of the gateway's own, unique to the load, and relays to no
// one. Under the caller's id it collided with the caller's requests after
// the call ended: a late notifications/cancelled naming the answered call,
// which matches no call in the gateway and goes upstream, cancelled the
// load; a next request reusing the id, as JSON-RPC allows once it is
// answered, got the upstream's 400 for a duplicate id in flight.
//
// It captures into lw (a writer with no caller), whose done tells when the
// load has ended.
func (g *Gateway) loadDetachedTo(ctx context.Context, r *http.Request, p auth.Principal, rt *runtime, fwd relay, lw *leaderWriter) ([]byte, bool, error) {
	id, _ := json.Marshal(loadIDPrefix + newRequestID())
	body, msg, err := mcp.WithID(fwd.Body, id)
	if err != nil {
		lw.finish()
		return nil, false, fmt.Errorf("a detached load's request: %w", err)
	}
	fwd.Body, fwd.Msg = body, msg
	return g.load(ctx, r, p, rt, fwd, lw)
}

// bypassCache forwards the call without the cache, reporting what its
// answer was: whether the answer was an error or a 5xx, the result, and
// the HTTP status written (the caller overwrites its own record with them).
func (g *Gateway) bypassCache(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay, call *liveCall) (bool, json.RawMessage, int) {
	call.cached.Store(false)
	g.metrics.CacheRequests.WithLabelValues("bypass").Inc()
	g.trace.cache(r.Context(), "bypass")
	var failed bool
	var loaded json.RawMessage
	report := fwd.answered
	f := fwd
	f.answered = func(result, rpcErr json.RawMessage) {
		failed, loaded = rpcErr != nil || isErrorResult(result), result
		if report != nil {
			report(result, rpcErr)
		}
	}
	status := g.forwardCall(w, r, rt, f, call)
	return failed || status >= 500, loaded, status
}

// streamedAnswer waits until the load streaming its answer to the caller
// has ended (or the caller left: the load goes on for the flight without
// it), sends the held response event, and reports that answer as a
// forwarded call's.
func (g *Gateway) streamedAnswer(r *http.Request, lw *leaderWriter, answered resultHook) (failed bool, loaded json.RawMessage, status int) {
	select {
	case <-lw.done:
		// The response event is held until now: the call is settled on
		// it before the caller has it.
		if _, result, rpcErr := lw.outcome(); result != nil || rpcErr != nil {
			answered.call(result, rpcErr)
		}
		lw.flushHeld()
	case <-r.Context().Done():
	}
	lw.detach()
	g.metrics.CacheRequests.WithLabelValues(cache.Miss.String()).Inc()
	g.trace.cache(r.Context(), cache.Miss.String())
	status, result, rpcErr := lw.outcome()
	noteLoaded(r.Context(), result, rpcErr)
	switch {
	case errors.Is(context.Cause(r.Context()), mcp.ErrCancelled):
		g.metrics.Requests.WithLabelValues("tools/call", "cancelled").Inc()
		return false, nil, status
	case r.Context().Err() != nil:
		return false, nil, status // gone: says nothing of the agent
	}
	failed = rpcErr != nil || isErrorResult(result) || status >= 500
	outcome := "admitted"
	if status >= 500 {
		outcome = "upstream_error"
	}
	g.metrics.Requests.WithLabelValues("tools/call", outcome).Inc()
	return failed, result, status
}

// failedFlightAnswer answers a call whose flight ended without a value and
// whose own load is not streaming to it; ran tells whether this caller's
// loader ran. The results are cachedCall's.
func (g *Gateway) failedFlightAnswer(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay, call *liveCall, err error, ran bool) (failed bool, loaded json.RawMessage, status int) {
	var u *uncacheable
	switch {
	case errors.As(err, &u) && (u.interim || u.denial) && !ran:
		// Another caller's load got an interim answer or a denial: it
		// is that caller's (its request state, its input to give, its
		// limit). Ask for this caller's own.
		return g.bypassCache(w, r, rt, fwd, call)
	case errors.As(err, &u):
		return g.uncacheableAnswer(w, fwd.Msg, u)
	case errors.Is(context.Cause(r.Context()), mcp.ErrCancelled):
		// MCP: a cancelled request gets no response.
		g.metrics.Requests.WithLabelValues("tools/call", "cancelled").Inc()
		w.WriteHeader(http.StatusAccepted)
		return false, nil, http.StatusAccepted
	case r.Context().Err() != nil:
		return false, nil, 0 // the caller went away
	default:
		g.metrics.Requests.WithLabelValues("tools/call", "upstream_error").Inc()
		mcp.WriteError(w, http.StatusBadGateway, fwd.Msg.ID, mcp.CodeInternalError, "upstream MCP server unavailable: "+err.Error(), nil)
		return true, nil, http.StatusBadGateway
	}
}

// uncacheableAnswer writes a load's answer that is not cached, with the
// caller's id.
func (g *Gateway) uncacheableAnswer(w http.ResponseWriter, msg *mcp.Message, u *uncacheable) (failed bool, loaded json.RawMessage, status int) {
	outcome := "admitted" // as forward counts them: relayed below 500
	if u.status >= 500 {
		outcome = "upstream_error"
	}
	g.metrics.Requests.WithLabelValues("tools/call", outcome).Inc()
	if u.retryAfter != "" {
		w.Header().Set("Retry-After", u.retryAfter)
	}
	if u.value != nil {
		writeRPC(w, u.status, msg.ID, u.member, u.value)
	} else {
		mcp.WriteError(w, u.status, msg.ID, mcp.CodeInternalError, "upstream MCP server unavailable", nil)
	}
	return !u.interim || isErrorResult(u.value), nil, u.status
}

// entryAnswer writes the flight's value as JSON with the caller's id,
// telling answered first. It reports whether the value is a negative
// (isError) result, the value as loaded when src is a miss (this caller's
// own flight ran the loader; nil otherwise) and the status written.
func (g *Gateway) entryAnswer(w http.ResponseWriter, r *http.Request, msg *mcp.Message, entry cache.Entry, src cache.Source, answered resultHook) (failed bool, loaded json.RawMessage, status int) {
	g.metrics.Requests.WithLabelValues("tools/call", "admitted").Inc()
	g.metrics.CacheRequests.WithLabelValues(src.String()).Inc()
	g.trace.cache(r.Context(), src.String())
	w.Header().Set("X-Mcp-Cache", src.String())
	answered.call(entry.Value, nil) // before the caller has it
	writeRPC(w, http.StatusOK, msg.ID, "result", entry.Value)
	if src == cache.Miss {
		loaded = entry.Value
	}
	return entry.Negative, loaded, http.StatusOK
}

// countDegraded counts an answer the cache loaded without its store (the
// cache logs the store's state changes).
func (g *Gateway) countDegraded(e cache.Entry) {
	if e.StoreErr == nil {
		return
	}
	reason := "error"
	if errors.Is(e.StoreErr, cache.ErrStoreSkipped) {
		reason = "skipped"
	}
	g.metrics.CacheDegraded.WithLabelValues(reason).Inc()
}

// writeRPC writes a JSON-RPC response with the caller's id around a result
// or an error object.
func writeRPC(w http.ResponseWriter, status int, id json.RawMessage, member string, value json.RawMessage) {
	if id == nil {
		id = json.RawMessage("null")
	}
	var b bytes.Buffer
	b.Grow(len(value) + len(id) + 40)
	b.WriteString(`{"jsonrpc":"2.0","id":`)
	b.Write(id)
	b.WriteString(`,"` + member + `":`)
	b.Write(value)
	b.WriteByte('}')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// resultHook is told a call's answer (its result, or its JSON-RPC error)
// before the caller has it; nil: nobody needs it.
type resultHook func(result, rpcErr json.RawMessage)

func (h resultHook) call(result, rpcErr json.RawMessage) {
	if h != nil {
		h(result, rpcErr)
	}
}
