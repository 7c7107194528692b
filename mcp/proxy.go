package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
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
	// yet, else ended an SSE answer with a JSON-RPC error event. A call's
	// stream that the upstream leaves open after the call's response is
	// ended at the same bounds without this error: nothing was cut.
	ErrUpstreamTimeout = errors.New("mcp: upstream timed out")
	// ErrBadUpstreamResponse means the upstream's answer could not be
	// inspected as Forward required (too large, a list result that cannot
	// be filtered, an answer that is not the request's response but could
	// hold a list, an event stream the proxy would read differently from a
	// client), or a request's 2xx JSON answer is not its response, or a
	// request's 2xx answer is neither JSON nor an event stream. Serve
	// answered 502 rather than relay it unchecked, or ended a stream that
	// had begun with an error event.
	ErrBadUpstreamResponse = errors.New("mcp: bad upstream response")
	// ErrUpstreamRefused means the upstream answered 401 or 403: it
	// refused the credentials mcpgate sends it (ProxyOptions.Headers; MCP
	// forbids passing the client's token on), or its Origin or host
	// checks refused mcpgate. Serve answered 502, not the upstream's
	// status: a client given a 401 or 403 would take it for its own token
	// and start its authorization again, to no avail. It wraps
	// ErrUpstreamUnavailable.
	ErrUpstreamRefused = fmt.Errorf("%w: the upstream refused mcpgate's credentials", ErrUpstreamUnavailable)
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
	// MaxResponseBytes bounds a non-SSE answer the proxy must inspect (its
	// caller reads it with Exchange.Answer, Forward has a Filter for the
	// request's method, or ReplayFilters screen the answer to a GET or a
	// DELETE). Zero means DefaultMaxResponseBytes. Answers relayed without
	// inspection are not bounded; a request's 2xx JSON answer nobody reads
	// is checked to be that request's response when it is at most 1 MiB,
	// and relayed unchecked when larger.
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
		p.client = NewClient()
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

// NewClient returns the client a Proxy uses when ProxyOptions.Client is
// nil: pooled keep-alive connections (up to 64 idle per host), redirects
// not followed. Each client has its own pool, which nothing closes when
// its Proxy is dropped: a caller that replaces its Proxy (a config
// reload) should pass one client to all of them, so that the idle
// connections of one are the next one's, and call CloseIdleConnections
// when done with it.
func NewClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
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
	// SSE answers alike, whatever the HTTP status. A result that cannot be
	// filtered is not relayed (502, or an error event on a stream that has
	// begun), and neither is a non-SSE answer that is not Msg's response
	// but could carry a list (any 2xx; an error status whose body could
	// hold a result).
	Filter Filter
	// ReplayFilters are applied to responses that reach the client on a
	// stream whose request the proxy does not know: every JSON-RPC response
	// with a result on a GET stream (a resumed stream, Last-Event-ID, replays
	// the answers to earlier POSTs as the upstream stored them, unfiltered),
	// and on a POST's SSE answer every response other than the one to Msg.
	// Such a response is judged by its shape: when its result has a
	// top-level member named like a filter's List.Member (ignoring ASCII
	// case), that filter is applied as Filter is to Msg's answer (Private
	// included); so is an event named other than "message", which MCP
	// clients ignore, when it could carry one. An event whose list cannot
	// be filtered, or whose data looks like a response but does not parse,
	// is dropped and logged, never relayed unfiltered. Events whose data
	// cannot hold a result (notifications, mostly) pass unchanged without a
	// full parse. A non-SSE answer to a GET or a DELETE (MCP has none that
	// holds a result) is read whole, bounded, and screened the same way
	// (502 where an event would be dropped; for a DELETE, whose answer
	// carries nothing MCP reads, the status with no body instead of a
	// filtered or dropped one); one to a POST that the proxy
	// reads (Exchange.Answer, or Filter) is refused with 502 when it is not
	// Msg's response and could hold a result (a JSON-RPC error passes).
	// Filter, when set, is one of them. Filters with a nil Allow are
	// ignored; nil means none (every event relayed as is).
	ReplayFilters []Filter
	// AskedClient, when set, is called for each request the upstream
	// sends the client (sampling, elicitation, roots; a ping is not one)
	// on a call's SSE answer before that answer, or on a GET stream, before
	// the event is relayed: a result the upstream gives after the client
	// answered may hold that answer.
	AskedClient func()
	// AllowTool is the Filter of a tools/list: when set and Filter is not,
	// it acts as Filter{List: ToolsList, Allow: AllowTool}.
	//
	// Deprecated: set Filter.
	AllowTool func(name string) bool
}

// Serve relays the client request r to the upstream and the upstream's
// answer back to w, and returns when the answer is fully relayed or the
// client went away. It is Start followed by Finish: a caller that must see
// the answer before the client does, or rewrite the session id the client
// sees, drives the Exchange itself.
//
// POST, GET (the server-initiated stream) and DELETE (session end) are
// relayed; other methods get 405. Allowlisted request headers are forwarded
// (Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID, Mcp-Method,
// Mcp-Name, Mcp-Param-*, Accept, Content-Type, User-Agent, trace context);
// Authorization, Cookie and every other header are not. The upstream's
// status, Mcp-Session-Id and Content-Type are passed back. A
// text/event-stream answer is relayed event by event with a flush after
// each and X-Accel-Buffering: no, never buffered whole. A request's 2xx
// JSON answer is read whole (bounded) and relayed only when it is that
// request's response: relayed with another id, it would leave the client
// waiting for its own (502 instead); so would a 2xx of another type (a
// 202), also refused.
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
	return p.Start(w, r, f).Finish()
}

// Start sends the client request r upstream, as Serve does, and returns
// once the upstream's response headers arrived or the request failed before
// them. Nothing has been written to w yet, except when Start refused the
// request itself (405, or a POST body that does not parse): then w has its
// answer and Finish returns it. The caller must call Finish.
func (p *Proxy) Start(w http.ResponseWriter, r *http.Request, f Forward) *Exchange {
	x := &Exchange{p: p, w: w, r: r, out: r, f: f}
	switch r.Method {
	case http.MethodPost:
		if f.Msg == nil {
			m, err := Parse(f.Body)
			if err != nil {
				e := err.(*Error)
				e.Respond(w)
				x.finished(e.HTTPStatus, e)
				return x
			}
			x.f.Msg = m
		}
	case http.MethodGet, http.MethodDelete:
		x.f.Body, x.f.Msg = nil, nil
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		WriteError(w, http.StatusMethodNotAllowed, nil, CodeInvalidRequest, "method not allowed", nil)
		x.finished(http.StatusMethodNotAllowed, nil)
		return x
	}
	if x.f.Filter.Allow == nil && x.f.AllowTool != nil {
		x.f.Filter = Filter{List: ToolsList, Allow: x.f.AllowTool}
	}
	x.private = HasCachingHints(r.Header.Get(HeaderProtocolVersion))
	x.f.Filter.Private = x.f.Filter.Private || x.private

	ctx, idle, stop := p.deadlines(r, x.f)
	x.idle, x.stop = idle, stop
	var body io.Reader
	if r.Method == http.MethodPost {
		body = bytes.NewReader(x.f.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, p.upstream, body)
	if err != nil {
		x.failed(err)
		return x
	}
	x.out = req
	copyRequestHeaders(req.Header, r.Header)
	if r.Method == http.MethodPost {
		// The body was read as UTF-8 JSON: the upstream must read it so.
		// A client's charset parameter (utf-7, utf-16...) would have an
		// upstream that honours it (the TypeScript SDK's, through
		// raw-body and iconv-lite) decode other text than the gateway
		// authorized: "+AHQ-ools/call" is tools/call in UTF-7.
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range p.headers {
		req.Header[k] = append([]string(nil), v...)
	}
	for k, v := range x.f.Header {
		req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		x.failed(err)
		return x
	}
	idle.touch()
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		_ = resp.Body.Close()
		x.failed(fmt.Errorf("%w (HTTP %d)", ErrUpstreamRefused, resp.StatusCode))
		return x
	}
	x.resp = resp
	x.sse = IsEventStream(resp.Header.Get("Content-Type")) && resp.StatusCode/100 == 2
	x.checkAnswerType()
	return x
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

// IsEventStream reports whether a Content-Type names an event stream as a
// client reads it: the media type, whatever its parameters (a malformed
// one included), is text/event-stream.
func IsEventStream(contentType string) bool {
	return mediaType(contentType) == "text/event-stream"
}

func mediaType(v string) string {
	// The two types MCP servers send, as they send them, skip the general
	// parser (a measurable part of the proxy's per-call cost).
	switch v {
	case "application/json", "text/event-stream", "application/json; charset=utf-8":
		return strings.TrimSuffix(v, "; charset=utf-8")
	}
	// A malformed parameter still names the type (ParseMediaType returns
	// it with ErrInvalidMediaParameter), and clients go by the type: an
	// event stream read as JSON would reach them unscreened, or be refused.
	t, _, err := mime.ParseMediaType(v)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return ""
	}
	return t
}

// copyBufs holds the buffers of answers relayed without inspection. The
// writer the gateway passes wraps the server's (deadlines, status), which
// hides the server's own pooled ReadFrom: without a pool every relayed
// answer would allocate io.Copy's 32 KiB buffer.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
