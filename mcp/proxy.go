package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors Serve returns; check them with errors.Is.
var (
	// ErrUpstreamUnavailable means the upstream could not be reached or broke
	// off its answer. Serve answered 502 if nothing had been sent yet.
	ErrUpstreamUnavailable = errors.New("mcp: upstream unavailable")
	// ErrUpstreamTimeout means the upstream went silent for longer than
	// ProxyOptions.Timeout, or did not finish within
	// ProxyOptions.MaxDuration. Serve answered 504 if nothing had been sent
	// yet, else ended an SSE answer with a JSON-RPC error event.
	ErrUpstreamTimeout = errors.New("mcp: upstream timed out")
	// ErrBadUpstreamResponse means the upstream's answer could not be
	// inspected as Forward required (too large, or a list result that cannot
	// be filtered). Serve answered 502 rather than relay it unchecked.
	ErrBadUpstreamResponse = errors.New("mcp: bad upstream response")
	// ErrClientGone means the client went away before the answer was fully
	// relayed; the upstream request was cancelled.
	ErrClientGone = errors.New("mcp: client went away")
	// ErrCancelled means the client cancelled its request while it was
	// relayed: the caller of Serve cancelled the request's context with
	// this error as the cause (context.WithCancelCause), typically on the
	// client's notifications/cancelled. The upstream request was cancelled
	// and, as MCP asks, the request got no answer: an SSE answer ended
	// without an error event; before anything was sent, Serve answered 202
	// Accepted with no body.
	ErrCancelled = errors.New("mcp: request cancelled by the client")
)

// errMaxDuration is the cause of a call cut by ProxyOptions.MaxDuration.
var errMaxDuration = fmt.Errorf("%w: over the maximum duration", ErrUpstreamTimeout)

// StatusClientClosedRequest is the status Serve reports (it is never sent)
// when the client went away before any status was written.
const StatusClientClosedRequest = 499

// Defaults for ProxyOptions.
const (
	DefaultTimeout          = 60 * time.Second
	DefaultMaxResponseBytes = 16 << 20
	DefaultMaxEventBytes    = 16 << 20 // the Go SDK client's own limit
)

// ProxyOptions configures a Proxy. Only Upstream is required.
type ProxyOptions struct {
	// Upstream is the URL of the upstream MCP endpoint (http or https).
	Upstream string
	// Headers are set on every upstream request, replacing any client value:
	// typically the gateway's own upstream credential.
	Headers http.Header
	// Client sends upstream requests. nil means a client with pooled
	// keep-alive connections that does not follow redirects. Its Timeout
	// should be zero: a server-initiated GET stream lives for the whole
	// session.
	Client *http.Client
	// Timeout is the idle timeout of a POST or DELETE exchange: it fails
	// with ErrUpstreamTimeout when the upstream sends nothing for this long,
	// from sending the request to the response headers, between two events
	// of an SSE answer (each event, a progress notification or a comment
	// included, starts it again), and between two reads of a JSON answer.
	// Zero means DefaultTimeout; negative means none. Notification streams
	// are not bounded: GET, and the subscriptions/listen POST of MCP
	// 2026-07-28.
	Timeout time.Duration
	// MaxDuration, when positive, caps the whole POST or DELETE exchange
	// however much the upstream streams (ErrUpstreamTimeout past it). Zero
	// or negative means no cap. Notification streams are not capped.
	MaxDuration time.Duration
	// MaxResponseBytes bounds a JSON answer the proxy must inspect (when
	// Forward has OnResult, or a Filter for the request's method). Zero means
	// DefaultMaxResponseBytes. Answers relayed without inspection are not
	// bounded.
	MaxResponseBytes int64
	// MaxEventBytes bounds one server-sent event. Zero means
	// DefaultMaxEventBytes.
	MaxEventBytes int
	// Logger receives upstream failures at Warn level. nil discards them.
	Logger *slog.Logger
}

// Proxy relays MCP Streamable HTTP exchanges to one upstream. It is safe for
// concurrent use.
type Proxy struct {
	upstream string
	headers  http.Header
	client   *http.Client
	timeout  time.Duration // idle; <= 0: none
	maxDur   time.Duration // <= 0: none
	maxResp  int64
	maxEvent int
	log      *slog.Logger
}

// NewProxy validates opts and returns a Proxy.
func NewProxy(opts ProxyOptions) (*Proxy, error) {
	u, err := url.Parse(opts.Upstream)
	if err != nil {
		return nil, fmt.Errorf("mcp: upstream URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("mcp: upstream URL %q: want http(s)://host/path", opts.Upstream)
	}
	if opts.MaxResponseBytes < 0 || opts.MaxEventBytes < 0 {
		return nil, errors.New("mcp: negative MaxResponseBytes or MaxEventBytes")
	}
	p := &Proxy{
		upstream: u.String(),
		headers:  opts.Headers.Clone(),
		client:   opts.Client,
		timeout:  opts.Timeout,
		maxDur:   opts.MaxDuration,
		maxResp:  opts.MaxResponseBytes,
		maxEvent: opts.MaxEventBytes,
		log:      opts.Logger,
	}
	if p.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		p.client = &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	if p.maxResp == 0 {
		p.maxResp = DefaultMaxResponseBytes
	}
	if p.maxEvent == 0 {
		p.maxEvent = DefaultMaxEventBytes
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p, nil
}

// Forward describes one client request for Serve.
type Forward struct {
	// Body is the already-read POST body, sent upstream unchanged (nil for
	// GET and DELETE).
	Body []byte
	// Msg is Body parsed. When nil on a POST, Serve parses Body itself and
	// answers a parse error to the client.
	Msg *Message
	// Header holds extra headers for this upstream request, set after
	// ProxyOptions.Headers (e.g. X-Mcp-Tenant, X-Mcp-Subject).
	Header http.Header
	// Filter, when its Allow is set and Msg is a request of its List's
	// method, removes from the result every entry Allow refuses, in JSON and
	// SSE answers alike. A result that cannot be filtered is not relayed
	// (502, or an error event on a stream that has begun).
	Filter Filter
	// ReplayFilters are applied to responses that reach the client on a
	// stream whose request the proxy does not know: every JSON-RPC response
	// with a result on a GET stream (a resumed stream, Last-Event-ID, replays
	// the answers to earlier POSTs as the upstream stored them, unfiltered),
	// and on a POST's SSE answer every response other than the one to Msg.
	// Such a response is judged by its shape: when its result has a
	// top-level member named like a filter's List.Member (ignoring ASCII
	// case), that filter is applied as Filter is to Msg's answer (Private
	// included). An event whose list cannot be filtered, or whose data looks
	// like a response but does not parse, is dropped and logged, never
	// relayed unfiltered. Events whose data cannot hold a result
	// (notifications, mostly) pass unchanged without a full parse. Filters
	// with a nil Allow are ignored; nil means none (every event relayed as
	// is). JSON (non-SSE) answers are not screened.
	ReplayFilters []Filter
	// AllowTool is the Filter of a tools/list: when set and Filter is not,
	// it acts as Filter{List: ToolsList, Allow: AllowTool}.
	//
	// Deprecated: set Filter.
	AllowTool func(name string) bool
	// OnResult, when set and Msg is a request, is called once with the
	// JSON-RPC response to Msg.ID: its result (after filtering) or
	// its error object. It runs before that response is written to the
	// client. When the upstream gives no such response, OnResult receives the
	// error object describing what happened instead (the one sent to the
	// client when Serve answered 502/504, or one describing the upstream's
	// HTTP status). It is not called when the client went away first, nor
	// when an SSE stream carrying event ids ended early (the client may
	// resume it with a GET, whose replayed responses only ReplayFilters
	// screen).
	OnResult func(result json.RawMessage, rpcErr json.RawMessage)
	// SessionID, when set, rewrites the Mcp-Session-Id the upstream answers
	// before the client sees it (the gateway binds sessions to callers).
	SessionID func(upstream string) string
	// OnResponse, when set, is called once, from Serve's goroutine, when
	// the upstream's response headers arrived or the request failed before
	// them; not at all when Serve refused the request itself (405, a body
	// that does not parse). It runs before anything is relayed.
	OnResponse func()
}

// Serve relays the client request r to the upstream and the upstream's
// answer back to w, and returns when the answer is fully relayed or the
// client went away. POST, GET (the server-initiated stream) and DELETE
// (session end) are relayed; other methods get 405.
//
// Allowlisted request headers are forwarded (Mcp-Session-Id,
// MCP-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name, Mcp-Param-*,
// Accept, Content-Type, User-Agent, trace context); Authorization, Cookie
// and every other header are not. The upstream's status, Mcp-Session-Id and
// Content-Type are passed back. A text/event-stream answer is relayed event
// by event with a flush after each and X-Accel-Buffering: no, never buffered
// whole.
//
// The upstream request dies with the client's: a client that goes away
// cancels it (ErrClientGone), and so does a cancellation of r's context with
// cause ErrCancelled (see there). POST and DELETE exchanges are bounded by
// ProxyOptions.Timeout (idle) and MaxDuration.
//
// It returns the HTTP status sent to the client (StatusClientClosedRequest
// if none was) and nil, or an error matching ErrUpstreamUnavailable,
// ErrUpstreamTimeout, ErrBadUpstreamResponse, ErrClientGone or
// ErrCancelled, or the *Error of an unparsable body.
func (p *Proxy) Serve(w http.ResponseWriter, r *http.Request, f Forward) (status int, err error) {
	switch r.Method {
	case http.MethodPost:
		if f.Msg == nil {
			m, err := Parse(f.Body)
			if err != nil {
				e := err.(*Error)
				e.Respond(w)
				return e.HTTPStatus, e
			}
			f.Msg = m
		}
	case http.MethodGet, http.MethodDelete:
		f.Body, f.Msg = nil, nil
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		WriteError(w, http.StatusMethodNotAllowed, nil, CodeInvalidRequest, "method not allowed", nil)
		return http.StatusMethodNotAllowed, nil
	}

	ctx, idle, stop := p.deadlines(r, f)
	defer stop()

	var body io.Reader
	if r.Method == http.MethodPost {
		body = bytes.NewReader(f.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, p.upstream, body)
	if err != nil {
		return p.fail(w, r, f, nil, err)
	}
	copyRequestHeaders(req.Header, r.Header)
	for k, v := range p.headers {
		req.Header[k] = append([]string(nil), v...)
	}
	for k, v := range f.Header {
		req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
	}

	if f.Filter.Allow == nil && f.AllowTool != nil {
		f.Filter = Filter{List: ToolsList, Allow: f.AllowTool}
	}
	private := HasCachingHints(r.Header.Get(HeaderProtocolVersion))
	f.Filter.Private = f.Filter.Private || private
	x := &exchange{p: p, w: w, r: r, out: req, f: f, idle: idle, private: private}
	resp, err := p.client.Do(req)
	if f.OnResponse != nil {
		f.OnResponse()
	}
	if err != nil {
		return p.fail(w, r, f, x, err)
	}
	defer resp.Body.Close()
	idle.touch()

	if mediaType(resp.Header.Get("Content-Type")) == "text/event-stream" && resp.StatusCode/100 == 2 {
		return x.relaySSE(resp)
	}
	return x.relayBody(resp)
}

// exchange is the state of one Serve call.
type exchange struct {
	p        *Proxy
	w        http.ResponseWriter
	r        *http.Request
	out      *http.Request // the request sent upstream (its context carries the deadlines)
	f        Forward
	idle     *idleTimer // nil: no idle timeout
	private  bool       // the client reads caching hints: filtered lists are marked private
	replay   []Filter   // f.ReplayFilters, Private set as for f.Filter; built on first use (replayList)
	replayOK bool       // replay is built
	reported bool       // OnResult was called
	answered bool       // the response to f.Msg was relayed (SSE)
}

func (x *exchange) filtering() bool { return x.f.Filter.applies(x.f.Msg) }

func (x *exchange) report(result, rpcErr json.RawMessage) {
	if x.reported || x.f.OnResult == nil || !x.f.Msg.IsCall() {
		return
	}
	x.reported = true
	x.f.OnResult(result, rpcErr)
}

// cause classifies a failure of the upstream exchange.
func (x *exchange) cause(err error) error {
	switch {
	case errors.Is(context.Cause(x.r.Context()), ErrCancelled):
		return ErrCancelled
	case x.r.Context().Err() != nil:
		return ErrClientGone
	case errors.Is(context.Cause(x.out.Context()), ErrUpstreamTimeout):
		return context.Cause(x.out.Context()) // ErrUpstreamTimeout, maybe wrapped
	case errors.Is(err, ErrBadUpstreamResponse):
		return err
	}
	return fmt.Errorf("%w: %v", ErrUpstreamUnavailable, err)
}

// fail answers a failure that happened before anything was written.
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, f Forward, x *exchange, err error) (int, error) {
	if x == nil {
		x = &exchange{p: p, w: w, r: r, out: r, f: f}
	}
	err = x.cause(err)
	var id json.RawMessage
	if f.Msg != nil && f.Msg.Kind == Request {
		id = f.Msg.ID
	}
	status, msg := http.StatusBadGateway, "upstream MCP server unavailable"
	switch {
	case errors.Is(err, ErrClientGone):
		return StatusClientClosedRequest, err
	case errors.Is(err, ErrCancelled):
		// MCP: a cancelled request gets no response. The client may still
		// wait for its HTTP answer; 202 with no body is what the SDK
		// clients accept for a message that has none.
		w.WriteHeader(http.StatusAccepted)
		return http.StatusAccepted, err
	case errors.Is(err, ErrUpstreamTimeout):
		status, msg = http.StatusGatewayTimeout, "upstream MCP server timed out"
	case errors.Is(err, ErrBadUpstreamResponse):
		msg = "upstream MCP server sent an unusable response"
	}
	p.log.Warn("mcp upstream failure", "method", r.Method, "rpc_method", methodOf(f.Msg), "status", status, "err", err)
	x.report(nil, errorObject(CodeInternalError, msg))
	WriteError(w, status, id, CodeInternalError, msg, nil)
	return status, err
}

// copyResponseHeaders passes the allowlisted upstream headers on; it runs
// only once the upstream's answer is known to be relayed.
func (x *exchange) copyResponseHeaders(resp *http.Response) {
	for _, k := range forwardResponseHeaders {
		if v := resp.Header.Values(k); len(v) > 0 {
			v = append([]string(nil), v...)
			if k == HeaderSessionID && x.f.SessionID != nil {
				for i := range v {
					v[i] = x.f.SessionID(v[i])
				}
			}
			x.w.Header()[k] = v
		}
	}
}

func methodOf(m *Message) string {
	if m == nil {
		return ""
	}
	return m.Method
}

// relayBody relays a non-SSE answer: unchanged when nothing needs
// inspecting, else read whole (bounded), inspected, then written.
func (x *exchange) relayBody(resp *http.Response) (int, error) {
	w := x.w
	inspect := x.f.Msg.IsCall() && (x.f.OnResult != nil || x.filtering())
	body := x.idle.reader(resp.Body)
	if !inspect {
		x.copyResponseHeaders(resp)
		w.WriteHeader(resp.StatusCode)
		buf := copyBufs.Get().(*[]byte)
		_, err := io.CopyBuffer(w, body, *buf)
		copyBufs.Put(buf)
		if err != nil {
			return resp.StatusCode, x.cause(err)
		}
		return resp.StatusCode, nil
	}

	data, err := io.ReadAll(io.LimitReader(body, x.p.maxResp+1))
	if err == nil && int64(len(data)) > x.p.maxResp {
		err = fmt.Errorf("%w: answer over %d bytes", ErrBadUpstreamResponse, x.p.maxResp)
	}
	if err != nil {
		return x.p.fail(w, x.r, x.f, x, err)
	}
	ok2xx := resp.StatusCode/100 == 2
	matched := false
	if mediaType(resp.Header.Get("Content-Type")) == "application/json" {
		if m, err := Parse(data); err == nil && m.Kind == Response && SameID(m.ID, x.f.Msg.ID) {
			matched = true
			result := m.Result
			if x.filtering() && ok2xx && result != nil {
				filtered, err := filterList(result, x.f.Filter)
				if err != nil {
					return x.p.fail(w, x.r, x.f, x, err)
				}
				result, data = filtered, resultResponse(m.ID, filtered)
			}
			x.report(result, m.Error)
		}
	}
	if !matched {
		if x.filtering() && ok2xx {
			return x.p.fail(w, x.r, x.f, x, fmt.Errorf("%w: %s answer is not its JSON-RPC response", ErrBadUpstreamResponse, x.f.Msg.Method))
		}
		x.report(nil, errorObject(CodeInternalError, "upstream answered HTTP "+strconv.Itoa(resp.StatusCode)+" without a JSON-RPC response"))
	}
	x.copyResponseHeaders(resp)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(resp.StatusCode)
	if _, err := w.Write(data); err != nil {
		return resp.StatusCode, ErrClientGone
	}
	return resp.StatusCode, nil
}

// relaySSE relays an event stream event by event, flushing after each.
func (x *exchange) relaySSE(resp *http.Response) (int, error) {
	w := x.w
	x.copyResponseHeaders(resp)
	h := w.Header()
	h.Del("Content-Length")
	h.Set("X-Accel-Buffering", "no")
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-cache")
	}
	status := resp.StatusCode
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	_ = rc.Flush() // headers now: a GET stream may stay silent for long

	call := x.f.Msg.IsCall()
	resumable := false
	events := newEventReader(resp.Body, x.p.maxEvent)
	var streamErr error
	for {
		ev, err := events.next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				streamErr = err
			}
			break
		}
		x.idle.touch()
		resumable = resumable || ev.hasID
		out, stop := x.eventOut(ev)
		if stop != nil {
			_, _ = w.Write(out)
			_ = rc.Flush()
			return status, stop
		}
		if out == nil {
			continue
		}
		if _, err := w.Write(out); err != nil {
			return status, ErrClientGone
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return status, ErrClientGone
		}
	}

	var err error
	if streamErr != nil {
		if errors.Is(streamErr, errEventTooLarge) {
			streamErr = fmt.Errorf("%w: %v", ErrBadUpstreamResponse, streamErr)
		}
		err = x.cause(streamErr)
		if errors.Is(err, ErrClientGone) || errors.Is(err, ErrCancelled) {
			return status, err // no answer: nobody reads it, or MCP forbids it
		}
		x.p.log.Warn("mcp upstream stream broke", "rpc_method", methodOf(x.f.Msg), "err", err)
	}
	// The stream ended without the response. Unless the client can resume it
	// (event ids were sent, and it was not our timeout that cut it), answer
	// the call ourselves so the client is not left waiting.
	if call && !x.answered && (!resumable || errors.Is(err, ErrUpstreamTimeout)) {
		msg := "upstream MCP server ended the stream without a response"
		switch {
		case errors.Is(err, ErrUpstreamTimeout):
			msg = "upstream MCP server timed out"
		case errors.Is(err, ErrBadUpstreamResponse):
			msg = "upstream MCP server sent an unusable response"
		case err != nil:
			msg = "upstream MCP server unavailable"
		}
		x.report(nil, errorObject(CodeInternalError, msg))
		if _, werr := w.Write(errorEvent(x.f.Msg.ID, CodeInternalError, msg)); werr != nil {
			return status, ErrClientGone
		}
		_ = rc.Flush()
	}
	return status, err
}

// eventOut returns what the client gets for the upstream event ev: ev.raw,
// a rewritten event, or nil (nothing). A non-nil stop ends the relay after
// out (an error event) is written.
func (x *exchange) eventOut(ev sseEvent) (out []byte, stop error) {
	if ev.data == nil || (ev.name != "" && ev.name != "message") {
		return ev.raw, nil // not a message: clients ignore it
	}
	var m *Message
	var perr error
	if x.f.Msg.IsCall() && !x.answered {
		m, perr = Parse(ev.data)
		if perr == nil && m.Kind == Response && SameID(m.ID, x.f.Msg.ID) {
			return x.answer(ev, m)
		}
	}
	if len(x.replayList()) == 0 {
		return ev.raw, nil
	}
	return x.screenReplay(ev, m, perr), nil
}

// replayList returns x.replay, building it the first time an event needs
// it: most exchanges relay no event that is not their own answer.
func (x *exchange) replayList() []Filter {
	if !x.replayOK {
		x.replay, x.replayOK = replayFilters(x.f.ReplayFilters, x.private), true
	}
	return x.replay
}

// answer relays m, the response to f.Msg carried by ev: filtered when
// Forward.Filter applies, and reported to OnResult.
func (x *exchange) answer(ev sseEvent, m *Message) ([]byte, error) {
	x.answered = true
	out, result := ev.raw, m.Result
	if x.filtering() && result != nil {
		filtered, err := filterList(result, x.f.Filter)
		if err != nil {
			x.p.log.Warn("mcp upstream list result unfilterable", "rpc_method", x.f.Msg.Method, "err", err)
			msg := "upstream MCP server sent an unusable response"
			x.report(nil, errorObject(CodeInternalError, msg))
			return errorEvent(m.ID, CodeInternalError, msg), err
		}
		result = filtered
		out = rewriteEventData(ev.raw, resultResponse(m.ID, filtered))
	}
	x.report(result, m.Error)
	return out, nil
}

// resultResponse encodes a JSON-RPC success response.
func resultResponse(id, result json.RawMessage) []byte {
	b := make([]byte, 0, len(id)+len(result)+32)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

func mediaType(v string) string {
	// The two types MCP servers send, as they send them, skip the general
	// parser (a measurable part of the proxy's per-call cost).
	switch v {
	case "application/json", "text/event-stream", "application/json; charset=utf-8":
		return strings.TrimSuffix(v, "; charset=utf-8")
	}
	t, _, err := mime.ParseMediaType(v)
	if err != nil {
		return ""
	}
	return t
}

// copyBufs holds the buffers of answers relayed without inspection. The
// writer the gateway passes wraps the server's (deadlines, status), which
// hides the server's own pooled ReadFrom: without a pool every relayed
// answer would allocate io.Copy's 32 KiB buffer.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
