package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/mcpgate/mcpgate/internal/redact"
)

// Exchange is one request relayed by Proxy.Start, driven by its caller in
// steps:
//
//	x := p.Start(w, r, f)             // sent; the upstream's headers are in, or it failed
//	x.SetSessionID(bind(x.SessionID())) // optional: the session id the client sees
//	result, rpcErr, ok := x.Answer()  // optional: the response to f.Msg, read, not yet relayed
//	status, err := x.Finish()         // relays the answer and whatever follows it
//
// The steps are the caller's: the proxy never calls back into it. A
// gateway that must settle a call on its outcome before the client learns it
// (a breaker, a cache, a cost) does so between Answer and Finish. An
// Exchange belongs to one goroutine; Finish must be called exactly once.
type Exchange struct {
	p       *Proxy
	w       http.ResponseWriter
	r       *http.Request
	out     *http.Request // the request sent upstream (its context carries the deadlines)
	f       Forward
	idle    *idleTimer // nil: no idle timeout
	stop    func()     // releases the deadlines; nil before they were set
	private bool       // the client reads caching hints: filtered lists are marked private

	resp *http.Response // nil: the exchange failed before the upstream answered
	sse  bool           // resp is a 2xx event stream

	replay   []Filter // f.ReplayFilters, Private set as for f.Filter; built on first use (replayList)
	replayOK bool     // replay is built

	failure error // classified (cause) failure not yet answered; Finish answers it

	read           bool            // the answer was inspected (Answer, or screenBody): a non-SSE one is in body
	body           []byte          // the non-SSE answer read, as it is to be relayed
	unchecked      []byte          // the start of an answer too large for checkOwnResponse, relayed before the rest
	reported       bool            // result/rpcErr hold the response to f.Msg
	result, rpcErr json.RawMessage // see Answer

	events    *eventReader // SSE: set once the client has the response headers
	rc        *http.ResponseController
	held      []byte // SSE: bytes to write before relaying on (the answer, or an error event)
	resumable bool   // SSE: the upstream sent event ids
	ended     bool   // SSE: the upstream's stream ended (EOF, error, or stopErr)
	gone      bool   // SSE: a write to the client failed
	stopErr   error  // SSE: the relay ends after held with this error
	streamErr error  // SSE: why the stream ended (nil: EOF), as endStream classified it

	done   bool // Finish ran, or Start answered the request itself
	status int
	err    error
}

// SessionID returns the Mcp-Session-Id the upstream answered ("" for none,
// or when the exchange failed before the upstream answered).
func (x *Exchange) SessionID() string {
	if x.resp == nil {
		return ""
	}
	return x.resp.Header.Get(HeaderSessionID)
}

// SetSessionID makes the client see id as the Mcp-Session-Id of the
// upstream's answer (a gateway binds sessions to callers); SessionID then
// returns id. It has no effect when the upstream answered none, or after
// the answer's headers were written (by Answer on an event stream, or by
// Finish).
func (x *Exchange) SetSessionID(id string) {
	if x.SessionID() != "" {
		x.resp.Header.Set(HeaderSessionID, id)
	}
}

// Answer reads the upstream's answer up to the JSON-RPC response to
// Forward.Msg and returns that response, without relaying it: its result
// (after Forward.Filter) or its error object. Events of an SSE answer that
// come before it are relayed as they arrive; a JSON answer is read whole
// (bounded by ProxyOptions.MaxResponseBytes) and relayed by Finish.
//
// When the upstream gives no such response, rpcErr describes what happened
// instead: the error object the client will get with a 502 or 504, or one
// describing the upstream's HTTP status. So does it for a non-2xx answer
// that holds the response's result: clients take such an answer for an
// HTTP error and never read its result (it is still relayed as it came). ok is false, and nothing was read,
// when Msg is not a request; ok is also false when the client went away
// first, or when an SSE stream carrying event ids ended early (the client
// may resume it with a GET, whose replayed responses only ReplayFilters
// screen). Calling it again returns the same values.
func (x *Exchange) Answer() (result, rpcErr json.RawMessage, ok bool) {
	if x.read || x.done || !x.f.Msg.IsCall() {
		return x.result, x.rpcErr, x.reported
	}
	x.read = true
	switch {
	case x.failure != nil:
	case x.sse:
		x.startStream()
		x.relayEvents(true)
	default:
		x.readBody()
	}
	return x.result, x.rpcErr, x.reported
}

// Finish relays the rest of the exchange (Answer's response included) and
// returns what Serve returns.
func (x *Exchange) Finish() (status int, err error) {
	if x.done {
		return x.status, x.err
	}
	defer func() {
		x.Close()
		x.finished(status, err)
	}()
	if x.sse {
		return x.finishStream()
	}
	switch {
	case x.failure != nil || x.read:
	case x.filtering():
		x.Answer() // a filtered list is inspected whether or not the caller reads it
	case x.f.Msg == nil && len(x.replayList()) > 0:
		x.screenBody()
	case x.owesResponse():
		x.checkOwnResponse() // a client would wait for its response until its deadline
	}
	if x.failure != nil {
		return x.answerFailure()
	}
	if !x.read {
		return x.copyBody()
	}
	x.copyResponseHeaders()
	x.w.Header().Set("Content-Length", strconv.Itoa(len(x.body)))
	x.w.WriteHeader(x.resp.StatusCode)
	if _, err := x.w.Write(x.body); err != nil {
		return x.resp.StatusCode, ErrClientGone
	}
	return x.resp.StatusCode, nil
}

// Close releases the upstream's answer and the exchange's deadlines
// without relaying anything more: for a caller that gives up between
// Start and Finish (a step of its own failed). Finish calls it; after
// Finish it does nothing, and it may be deferred right after Start.
func (x *Exchange) Close() {
	if x.done {
		return
	}
	if x.resp != nil {
		x.resp.Body.Close()
	}
	if x.stop != nil {
		x.stop()
	}
}

func (x *Exchange) finished(status int, err error) {
	x.done, x.status, x.err = true, status, err
}

func (x *Exchange) filtering() bool { return x.f.Filter.applies(x.f.Msg) }

func (x *Exchange) report(result, rpcErr json.RawMessage) {
	if x.reported || !x.f.Msg.IsCall() {
		return
	}
	x.reported = true
	x.result, x.rpcErr = result, rpcErr
}

// cause classifies a failure of the upstream exchange.
func (x *Exchange) cause(err error) error {
	switch {
	case errors.Is(context.Cause(x.r.Context()), ErrCancelled):
		return ErrCancelled
	case x.r.Context().Err() != nil:
		return ErrClientGone
	case errors.Is(context.Cause(x.out.Context()), ErrUpstreamTimeout):
		return context.Cause(x.out.Context()) // ErrUpstreamTimeout, maybe wrapped
	case errors.Is(err, ErrBadUpstreamResponse), errors.Is(err, ErrUpstreamRefused):
		return err
	}
	// The upstream's URL may carry its credential (a key in its query):
	// this error is logged and traced on every failure.
	return fmt.Errorf("%w: %v", ErrUpstreamUnavailable, redact.URLError(err))
}

// failed records a failure that happened before anything was written, and
// reports the error object its answer carries (none when the client left).
func (x *Exchange) failed(err error) {
	x.failure = x.cause(err)
	if status, msg := failureAnswer(x.failure); status != 0 {
		x.report(nil, errorObject(CodeInternalError, msg))
	}
}

// failureAnswer is the status and message answering a classified failure;
// status 0 means none (the client left, or cancelled its request).
func failureAnswer(err error) (int, string) {
	switch {
	case errors.Is(err, ErrClientGone), errors.Is(err, ErrCancelled):
		return 0, ""
	case errors.Is(err, ErrUpstreamTimeout):
		return http.StatusGatewayTimeout, "upstream MCP server timed out"
	case errors.Is(err, ErrBadUpstreamResponse):
		return http.StatusBadGateway, "upstream MCP server sent an unusable response"
	case errors.Is(err, ErrUpstreamRefused):
		return http.StatusBadGateway, "upstream MCP server refused the gateway's credentials"
	}
	return http.StatusBadGateway, "upstream MCP server unavailable"
}

// answerFailure writes the answer to x.failure.
func (x *Exchange) answerFailure() (int, error) {
	err := x.failure
	status, msg := failureAnswer(err)
	switch {
	case errors.Is(err, ErrClientGone):
		return StatusClientClosedRequest, err
	case errors.Is(err, ErrCancelled):
		// MCP: a cancelled request gets no response. The client may still
		// wait for its HTTP answer; 202 with no body is what the SDK
		// clients accept for a message that has none.
		x.w.WriteHeader(http.StatusAccepted)
		return http.StatusAccepted, err
	}
	var id json.RawMessage
	if x.f.Msg != nil && x.f.Msg.Kind == Request {
		id = x.f.Msg.ID
	}
	x.p.log.Warn("mcp upstream failure", "method", x.r.Method, "rpc_method", methodOf(x.f.Msg), "status", status, "err", err)
	WriteError(x.w, status, id, CodeInternalError, msg, nil)
	return status, err
}

// copyResponseHeaders passes the allowlisted upstream headers on; it runs
// only once the upstream's answer is known to be relayed.
func (x *Exchange) copyResponseHeaders() {
	for _, k := range forwardResponseHeaders {
		if v := x.resp.Header.Values(k); len(v) > 0 {
			x.w.Header()[k] = append([]string(nil), v...)
		}
	}
	// The proxy reads JSON and event streams as UTF-8: a charset parameter
	// (utf-7...) would have a client that honours it (httpx) decode other
	// text than the one screened. The client gets the bare media type.
	switch t := mediaType(x.resp.Header.Get("Content-Type")); {
	case t == "application/json" || t == "text/event-stream":
		x.w.Header().Set("Content-Type", t)
	case typeLookalike(x.resp.Header.Values("Content-Type")):
		// Clients that match the type by substring or prefix (the
		// TypeScript SDK's includes, the Python SDK's startswith) would
		// read as JSON or an event stream an answer the proxy relays
		// unscreened as another type.
		x.w.Header().Set("Content-Type", "application/octet-stream")
	}
	// Every answer is the caller's own (its lists filtered to its scopes,
	// its session): a shared cache must not keep it for another, which an
	// upstream's "public", "s-maxage" or "must-revalidate" would allow
	// despite Authorization (RFC 9111, 3.5: these three, and only these).
	if sharedCacheable(x.w.Header().Values("Cache-Control")) {
		x.w.Header().Set("Cache-Control", "private, no-store")
	}
}

// sharedCacheable reports whether Cache-Control values hold a directive
// that lets a shared cache store the answer to a request with
// Authorization (RFC 9111, 3.5), in some letter case.
func sharedCacheable(values []string) bool {
	cc := strings.ToLower(strings.Join(values, ","))
	for _, d := range []string{"public", "s-maxage", "must-revalidate"} {
		if strings.Contains(cc, d) {
			return true
		}
	}
	return false
}

// typeLookalike reports whether Content-Type values, as a client joins
// them, hold "application/json" or "text/event-stream" in some letter case:
// what a client matching by substring or prefix reads as that type.
func typeLookalike(values []string) bool {
	v := strings.ToLower(strings.Join(values, ", "))
	return strings.Contains(v, "application/json") || strings.Contains(v, "text/event-stream")
}

// checkAnswerType refuses (ErrBadUpstreamResponse: 502 with the request's
// id) a request's 2xx answer that is neither JSON nor an event stream.
// MCP answers a request with one of those; a client given anything else
// waits for its response until its own timeout (a 202, which SDK clients
// take for "no body", or a 204), fails on it, or (a Content-Type that only
// holds one of the two types, see typeLookalike) reads as a response or a
// stream a body the proxy would have relayed unscreened, lists the
// caller's filters would hide included.
func (x *Exchange) checkAnswerType() {
	if !x.f.Msg.IsCall() || x.resp.StatusCode/100 != 2 || x.sse || mediaType(x.resp.Header.Get("Content-Type")) == "application/json" {
		return
	}
	ct := strings.Join(x.resp.Header.Values("Content-Type"), ", ")
	x.failed(fmt.Errorf("%w: %s answered HTTP %d with Content-Type %s", ErrBadUpstreamResponse, x.f.Msg.Method, x.resp.StatusCode, quoteCapped(ct)))
}

func methodOf(m *Message) string {
	if m == nil {
		return ""
	}
	return m.Method
}

// copyBody relays a non-SSE answer nobody inspects, unchanged.
func (x *Exchange) copyBody() (int, error) {
	x.copyResponseHeaders()
	x.w.WriteHeader(x.resp.StatusCode)
	if len(x.unchecked) > 0 {
		if _, err := x.w.Write(x.unchecked); err != nil {
			return x.resp.StatusCode, x.cause(err)
		}
	}
	buf := copyBufs.Get().(*[]byte)
	_, err := io.CopyBuffer(x.w, x.idle.reader(x.resp.Body), *buf)
	copyBufs.Put(buf)
	if err != nil {
		return x.resp.StatusCode, x.cause(err)
	}
	return x.resp.StatusCode, nil
}

// readAll reads the upstream's non-SSE answer whole, bounded by
// ProxyOptions.MaxResponseBytes; ok is false when it failed (recorded).
func (x *Exchange) readAll() (data []byte, ok bool) {
	data, err := readGrowing(x.idle.reader(x.resp.Body), x.resp.ContentLength, x.p.maxResp)
	if errors.Is(err, errOverLimit) {
		err = fmt.Errorf("%w: answer over %d bytes", ErrBadUpstreamResponse, x.p.maxResp)
	}
	if err != nil {
		x.failed(err)
		return nil, false
	}
	return data, true
}

// screenBody reads whole (bounded) into x.body a non-SSE answer to a GET or
// a DELETE, whose response the proxy cannot know (MCP answers those with a
// stream or no message at all), and screens it as a replayed event is
// (screened): a list is filtered, and a body that could hold one but
// cannot be read or filtered is refused. A DELETE's answer, which carries
// nothing MCP reads, keeps its status with no body instead: the session's
// end is not refused for what a server wrote beside it.
func (x *Exchange) screenBody() {
	data, ok := x.readAll()
	if !ok {
		return
	}
	x.read, x.body = true, data
	switch resp, err := x.screened(data, nil, nil); {
	case x.r.Method == http.MethodDelete && (err != nil || resp != nil):
		x.body = nil
	case err != nil:
		x.failed(err)
	case resp != nil:
		x.body = resp
	}
}

// owesResponse reports whether the upstream's answer is relayed only as the
// request's own JSON-RPC response: a 2xx JSON answer to a request, which the
// client takes for its response. Relayed with another id, or holding no
// response, it would leave the client waiting for its own until its
// deadline; readBody refuses it instead (502 with the request's id). A 2xx
// of another type was refused by Start (checkAnswerType); an answer of
// another status the client fails on at once.
func (x *Exchange) owesResponse() bool {
	return x.f.Msg.IsCall() && x.resp.StatusCode/100 == 2 && mediaType(x.resp.Header.Get("Content-Type")) == "application/json"
}

// checkedAnswerBytes bounds the answers checkOwnResponse reads: a larger
// one is relayed as it streams in, unchecked, as answers nobody reads
// always were (holding every large answer whole would cost memory in
// proportion to them, and refusing one past a bound would cut large
// resources). An answer carrying another request's id is small.
const checkedAnswerBytes = 1 << 20

// checkOwnResponse checks, as Answer does, an answer nobody else reads but
// that the client takes for its response (owesResponse), when it is at
// most checkedAnswerBytes: one that is not the request's response is
// refused. A larger one is relayed by copyBody, the part read first.
func (x *Exchange) checkOwnResponse() {
	if x.resp.ContentLength > checkedAnswerBytes {
		return
	}
	data, err := readGrowing(x.idle.reader(x.resp.Body), x.resp.ContentLength, checkedAnswerBytes)
	switch {
	case errors.Is(err, errOverLimit):
		x.unchecked = data
	case err != nil:
		x.failed(err)
	default:
		x.read = true
		x.judgeBody(data)
	}
}

// readBody reads a non-SSE answer whole (bounded) into x.body, filtered
// when Forward.Filter applies, and reports the response it carries.
func (x *Exchange) readBody() {
	data, ok := x.readAll()
	if !ok {
		return
	}
	x.judgeBody(data)
}

// judgeBody keeps data, a non-SSE answer read whole, in x.body as it is to
// be relayed (see readBody), or records the failure that refuses it.
func (x *Exchange) judgeBody(data []byte) {
	m, perr := Parse(data)
	response := perr == nil && m.Kind == Response
	if response && SameID(m.ID, x.f.Msg.ID) && mediaType(x.resp.Header.Get("Content-Type")) == "application/json" {
		result := m.Result
		if x.filtering() && result != nil { // whatever the status: a client may read a 4xx's body
			filtered, err := filterList(result, x.f.Filter)
			if err != nil {
				x.failed(err)
				return
			}
			result, data = filtered, resultResponse(m.ID, filtered)
		}
		x.body = data
		if result != nil && x.resp.StatusCode/100 != 2 {
			// Clients take a non-2xx answer for an HTTP error and never
			// read its result: a gateway must not either (a cost read
			// from it would bill a call its client got as a failure).
			x.report(nil, x.statusError("with a result"))
			return
		}
		x.report(result, m.Error)
		return
	}
	// A list that must be filtered is relayed only as the request's own
	// response, and a body that is not the request's response is refused
	// when it could carry a list the caller's filters would hide: with a
	// filtered list, any 2xx; and any body that could hold a result but is
	// not a plain JSON-RPC error (a "session not found" passes); and any
	// 2xx JSON answer, which the client would take for its response.
	errorOnly := response && m.Result == nil
	if x.owesResponse() || x.filtering() && x.resp.StatusCode/100 == 2 || len(x.replayList()) > 0 && mayHoldResult(data) && !errorOnly {
		x.failed(fmt.Errorf("%w: %s answer is not its JSON-RPC response", ErrBadUpstreamResponse, x.f.Msg.Method))
		return
	}
	x.body = data
	x.report(nil, x.statusError("without a JSON-RPC response"))
}

// statusError is the error object Answer reports for an answer whose HTTP
// status, not a JSON-RPC response, tells the outcome.
func (x *Exchange) statusError(what string) json.RawMessage {
	return errorObject(CodeInternalError, "upstream answered HTTP "+strconv.Itoa(x.resp.StatusCode)+" "+what)
}
