package federate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/redact"
	gwmcp "github.com/mcpgate/mcpgate/mcp"
)

// upstream is one server behind the Federator: its shared session, its
// breaker and its 429 back-off.
type upstream struct {
	f   *Federator
	cfg Upstream

	mu       sync.Mutex
	shared   *mcp.ClientSession // nil while not connected (HTTP: reconnected on use; stdio: by supervise)
	pipe     *stdioPipe         // stdio: the process of shared
	init     *mcp.InitializeResult
	down     bool      // stdio: the process is not running
	failures int       // consecutive
	openTill time.Time // breaker open until then (failures >= threshold)
	probing  bool      // a half-open probe is in flight
	limited  time.Time // 429 Retry-After of a request without a caller's identity: no call before then
	// limitedBy is the 429 back-off of each caller (see callerKey) the
	// upstream answered 429: none of that caller's calls before then. At
	// most MaxLimitedCallers entries; expired ones are dropped by tick.
	limitedBy map[string]time.Time
	restarts  int
	state     State
	// heard counts the upstream's answers through its MCP layer (calls
	// answered, liveness pings answered: see alive and throughMCP; a 4xx
	// is not one): a call that timed out compares it with its value when
	// the call was sent.
	heard uint64

	refreshMu    sync.Mutex  // one refresh at a time
	refreshAgain atomic.Bool // a refresh was asked for since the running one listed
	connMu       sync.Mutex  // one reconnection of the shared session at a time
	// lostGap is the wait before the next reconnection of an HTTP shared
	// session that ended by itself (see watchShared); up.mu guards it.
	lostGap time.Duration
}

func newUpstream(f *Federator, cfg Upstream) *upstream {
	return &upstream{f: f, cfg: cfg, state: StateUp}
}

// headerTransport sets an HTTP upstream's headers (its own, and those
// forwarded from the client's request), notes its 429s, records the status
// of a call's POST, answers a request's plain 4xx as its JSON-RPC error
// (see refusedAnswer), and counts the notifications of its event streams.
type headerTransport struct {
	base http.RoundTripper
	up   *upstream
	wire *wireCount
}

func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	fwd, _ := r.Context().Value(forwardKey{}).(http.Header)
	if len(t.up.cfg.Headers) > 0 || len(fwd) > 0 {
		r = r.Clone(r.Context())
		for k, v := range fwd {
			r.Header[k] = v
		}
		for k, v := range t.up.cfg.Headers {
			r.Header.Set(k, v)
		}
	}
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		t.up.rateLimited(t.up.callerKey(fwd), retryAfter(resp.Header.Get("Retry-After"), time.Now()))
	}
	if st, ok := r.Context().Value(statusKey{}).(*atomic.Int32); ok && r.Method == http.MethodPost {
		st.Store(int32(resp.StatusCode))
	}
	if answer, ok := t.refusedAnswer(r, resp); ok {
		return answer, nil
	}
	if gwmcp.IsEventStream(resp.Header.Get("Content-Type")) {
		resp.Body = &countedBody{counted: counted{r: resp.Body, w: t.wire}, Closer: resp.Body}
	} else {
		// The go-sdk client reads a JSON answer (and an error's body)
		// whole with io.ReadAll: bounded here as the proxy bounds one.
		resp.Body = &boundedBody{ReadCloser: resp.Body, left: gwmcp.DefaultMaxResponseBytes}
	}
	return resp, nil
}

// refusedAnswer returns the answer the go-sdk client is given instead of
// resp, the upstream's answer to r, and true; or false, leaving resp (its
// body possibly read, and put back) to the SDK. An HTTP 4xx (but 404, a
// lost session, and 429, on which the SDK keeps the session) to a POST of
// a JSON-RPC request, whose body is not JSON-RPC at all (a proxy's text
// or HTML, nothing), answers that one request: yet the SDK client ends
// its whole connection on it, and on a shared session (every client
// without a session, every stateless one) the other clients' calls in
// flight would fail with this one's refusal, counted against the
// upstream. So it becomes a 200 JSON-RPC error answering the request's id
// and naming the status, which the SDK hands to that call alone (which
// counts as answered: see call.verdict). A body that is a JSON-RPC error
// is the upstream's own answer, left to the SDK (see isJSONRPCError), and
// so is the 4xx of a session the upstream no longer has (see
// sessionGone): on it the SDK ends the session, and the next call opens a
// new one, where a rewritten answer would keep a dead session whose every
// call fails.
func (t *headerTransport) refusedAnswer(r *http.Request, resp *http.Response) (*http.Response, bool) {
	code := resp.StatusCode
	if r.Method != http.MethodPost || code < 400 || code >= 500 || code == http.StatusNotFound || code == http.StatusTooManyRequests || r.GetBody == nil {
		return resp, false
	}
	rb, err := r.GetBody()
	if err != nil {
		return resp, false
	}
	sent, err := io.ReadAll(io.LimitReader(rb, gwmcp.DefaultMaxResponseBytes))
	_ = rb.Close()
	if err != nil {
		return resp, false
	}
	msg, err := jsonrpc.DecodeMessage(sent)
	req, ok := msg.(*jsonrpc.Request)
	if err != nil || !ok || !req.IsCall() {
		return resp, false // a notification or a response: the SDK has no call to answer
	}
	// A body that is a JSON-RPC error is the upstream's word, left to the
	// SDK, which reads it whole: one answering the call's id fails that
	// call alone; one it cannot take as that answer (id null or absent: a
	// TypeScript SDK server that restarted and lost the session answers
	// 400 "No valid session ID provided" so) ends the session, and the
	// next call opens a new one. Rewritten, it would keep a dead session
	// whose every call fails.
	body, err := io.ReadAll(&boundedBody{ReadCloser: resp.Body, left: gwmcp.DefaultMaxResponseBytes})
	_ = resp.Body.Close()
	if err == nil && isJSONRPCError(body) || t.sessionGone(r) {
		resp.Body = io.NopCloser(bytes.NewReader(body))
		return resp, false
	}
	answer, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: t.up.refusedErr(code)})
	if err != nil {
		resp.Body = io.NopCloser(bytes.NewReader(body))
		return resp, false
	}
	return &http.Response{
		Status:        "200 OK",
		StatusCode:    http.StatusOK,
		Proto:         resp.Proto,
		ProtoMajor:    resp.ProtoMajor,
		ProtoMinor:    resp.ProtoMinor,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(answer)),
		ContentLength: int64(len(answer)),
		Request:       r,
	}, true
}

// probeBody is the ping sessionGone sends. Its answer is read by no one:
// its id is the gateway's own, never one of the SDK's (numbers).
const probeBody = `{"jsonrpc":"2.0","id":"mcpgate-session-probe","method":"ping"}`

// sessionGone reports whether the upstream no longer has the session of
// r, a request it refused with a plain 4xx: a ping in that session is
// refused with a 4xx too (but 429). A server that lost its sessions in a
// restart may answer their requests 400 in plain text (the Python SDK's
// "Bad Request: No valid session ID provided") rather than the 404 the
// SDK ends a session on; a refusal of the request itself (a proxy's 413,
// a client's bad request) leaves the ping answered. The ping goes as the
// session's own requests do, without the caller's forwarded headers: a
// caller the upstream refuses must not end the session of every client.
// A request of no session (a stateless upstream) has none to lose.
func (t *headerTransport) sessionGone(r *http.Request) bool {
	if r.Header.Get(gwmcp.HeaderSessionID) == "" {
		return false
	}
	p := r.Clone(r.Context())
	for _, k := range ForwardHeaders {
		p.Header.Del(k)
	}
	for k, v := range t.up.cfg.Headers {
		p.Header.Set(k, v)
	}
	p.Body = io.NopCloser(strings.NewReader(probeBody))
	p.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(probeBody)), nil }
	p.ContentLength = int64(len(probeBody))
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(p)
	if err != nil {
		return false // nothing learnt: the refused request keeps its answer
	}
	_ = resp.Body.Close()
	return resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests
}

// isJSONRPCError reports whether an HTTP answer's body is a JSON-RPC
// error: a "2.0" object with an error object, whatever its id (null,
// absent, or one the SDK does not decode). A proxy's text or HTML, an
// empty body, or other JSON is not.
func isJSONRPCError(body []byte) bool {
	var m struct {
		Version string          `json:"jsonrpc"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &m) != nil || m.Version != "2.0" {
		return false
	}
	e := bytes.TrimSpace(m.Error)
	return len(e) > 0 && e[0] == '{'
}

// errAnswerTooLarge ends the read of a non-SSE answer past its bound.
var errAnswerTooLarge = fmt.Errorf("federate: upstream answer over %d bytes", gwmcp.DefaultMaxResponseBytes)

// boundedBody fails a read past left bytes.
type boundedBody struct {
	io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// Exactly the bound is allowed (as the proxy's): only a byte more
		// is too large.
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 && err != nil {
			return 0, err
		}
		return 0, errAnswerTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// ForwardHeaders are the headers of a client's request that the
// Federator passes on to an HTTP upstream with the calls it makes for that
// request: trace context, and the caller's identity the gateway sets when
// upstream.identity_headers is on (it never lets a client set them).
var ForwardHeaders = []string{"Traceparent", "Tracestate", gwmcp.HeaderTenant, gwmcp.HeaderSubject}

// forwardKey is the context key of the headers to forward.
type forwardKey struct{}

// withForwarded returns ctx carrying the ForwardHeaders of the client's
// request (nil extra: none).
func withForwarded(ctx context.Context, extra *mcp.RequestExtra) context.Context {
	if extra == nil || extra.Header == nil {
		return ctx
	}
	var h http.Header
	for _, k := range ForwardHeaders {
		if v := extra.Header.Values(k); len(v) > 0 {
			if h == nil {
				h = make(http.Header, len(ForwardHeaders))
			}
			h[k] = v
		}
	}
	if h == nil {
		return ctx
	}
	return context.WithValue(ctx, forwardKey{}, h)
}

// maxRetryAfter caps the wait a Retry-After asks for: an upstream (or a
// proxy in front of it) cannot take itself out of service for longer.
const maxRetryAfter = time.Hour

// retryAfter parses a Retry-After value (seconds or an HTTP date), at most
// maxRetryAfter ahead of now; a missing or bad one means one second.
func retryAfter(v string, now time.Time) time.Time {
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return now.Add(time.Duration(min(s, int(maxRetryAfter/time.Second))) * time.Second)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		if limit := now.Add(maxRetryAfter); t.After(limit) {
			return limit
		}
		return t
	}
	return now.Add(time.Second)
}

// identityHeaders are the ForwardHeaders that say who the caller is: an
// upstream may limit each caller separately by them.
var identityHeaders = []string{gwmcp.HeaderTenant, gwmcp.HeaderSubject}

// callerKey is the key of the 429 back-off of a request carrying fwd (its
// ForwardHeaders): the tenant and subject the upstream receives with it
// (Upstream.Headers may set them too), so that an upstream limiting each
// tenant on its own keeps one tenant's back-off from refusing the
// others'. "" when the request carries no identity (no identity headers
// forwarded, the session's own requests): the upstream cannot have
// limited a caller, so the back-off is the whole upstream's.
func (up *upstream) callerKey(fwd http.Header) string {
	var ids [2][]string
	for i, k := range identityHeaders {
		ids[i] = fwd.Values(k)
		for hk, hv := range up.cfg.Headers { // set over the forwarded ones (see headerTransport)
			if http.CanonicalHeaderKey(hk) == k {
				ids[i] = []string{hv}
			}
		}
	}
	if len(ids[0]) == 0 && len(ids[1]) == 0 {
		return ""
	}
	// Control characters cannot be in a header value: the key is
	// unambiguous.
	return strings.Join(ids[0], "\x00") + "\x01" + strings.Join(ids[1], "\x00")
}

// callerOf is the callerKey of the calls made with ctx (see withForwarded).
func (up *upstream) callerOf(ctx context.Context) string {
	fwd, _ := ctx.Value(forwardKey{}).(http.Header)
	return up.callerKey(fwd)
}

// MaxLimitedCallers bounds the callers of one upstream whose 429 back-off
// is remembered (see the package doc): identities are the clients'
// and unbounded in number. Past it the back-off that ends first is
// forgotten (that caller's next call reaches the upstream, which answers
// 429 again if it still limits it).
const MaxLimitedCallers = 10_000

// rateLimited notes a 429 answered to the caller key (see callerKey; ""
// the whole upstream): no call of that caller before until.
func (up *upstream) rateLimited(key string, until time.Time) {
	up.mu.Lock()
	defer up.mu.Unlock()
	if key == "" {
		if until.After(up.limited) {
			up.limited = until
		}
		up.setStateLocked()
		return
	}
	prev, ok := up.limitedBy[key]
	switch {
	case ok && !until.After(prev):
		return
	case up.limitedBy == nil:
		up.limitedBy = map[string]time.Time{}
	case !ok && len(up.limitedBy) >= MaxLimitedCallers:
		now := time.Now()
		up.pruneLimitedLocked(now)
		if len(up.limitedBy) >= MaxLimitedCallers {
			up.forgetFirstLimitedLocked()
		}
	}
	up.limitedBy[key] = until
}

// pruneLimitedLocked drops the callers' back-offs that are over. up.mu is
// held.
func (up *upstream) pruneLimitedLocked(now time.Time) {
	for k, t := range up.limitedBy {
		if !now.Before(t) {
			delete(up.limitedBy, k)
		}
	}
}

// forgetFirstLimitedLocked drops the caller's back-off that ends first: it
// holds back the fewest calls. up.mu is held.
func (up *upstream) forgetFirstLimitedLocked() {
	var first string
	var at time.Time
	for k, t := range up.limitedBy {
		if at.IsZero() || t.Before(at) {
			first, at = k, t
		}
	}
	delete(up.limitedBy, first)
}

// limitedUntilLocked is when the calls of the caller key may go to the
// upstream again after a 429 (the whole upstream's back-off or the
// caller's own, the later), or zero when they may now. up.mu is held.
func (up *upstream) limitedUntilLocked(key string, now time.Time) time.Time {
	until := up.limited
	if key != "" {
		if t, ok := up.limitedBy[key]; ok && t.After(until) {
			until = t // an expired one is over: tick prunes it
		}
	}
	if !now.Before(until) {
		return time.Time{}
	}
	return until
}

// refusal is why a call is not sent to the upstream.
type refusal struct {
	reason string
	retry  time.Time // zero: unknown
}

// admit reports whether a call of the caller key (see callerKey) may go
// to the upstream now, and whether it is the half-open probe.
func (up *upstream) admit(now time.Time, caller string) (probe bool, r *refusal) {
	up.mu.Lock()
	defer up.mu.Unlock()
	limited := up.limitedUntilLocked(caller, now)
	switch {
	case up.down:
		return false, &refusal{reason: reasonDown}
	case !limited.IsZero():
		return false, &refusal{reason: reason429, retry: limited}
	case up.failures < up.f.opts.Failures:
		return false, nil
	case now.Before(up.openTill):
		return false, &refusal{reason: fmt.Sprintf("its circuit is open after %d consecutive failures", up.failures), retry: up.openTill}
	case up.probing:
		return false, &refusal{reason: "its circuit is half open and a probe call is in flight", retry: now.Add(time.Second)}
	}
	up.probing = true
	up.setStateLocked()
	return true, nil
}

// reason429 is the refusal of a call within a 429's Retry-After.
const reason429 = "it answered 429 Too Many Requests"

// reasonDown is the refusal of a call to a stdio upstream whose process
// is not running.
const reasonDown = "its process is not running (being restarted)"

// outcome is how a call that went to the upstream ended, for its breaker.
type outcome int

const (
	answered  outcome = iota // a result or a JSON-RPC error through its MCP layer (see throughMCP): the upstream works
	refused                  // an HTTP 4xx (429 too): not a failure, as answered, but no sign the upstream serves (see alive)
	failed                   // a transport error, or a timeout of an upstream that answers nothing (see alive)
	abandoned                // the client cancelled, or a call timed out on a live upstream: says nothing of the upstream
)

// throughMCP reports whether an answer that came with the HTTP status
// (0: none, a stdio upstream) came through the upstream's MCP layer: an
// HTTP 2xx. No 4xx does, not even one whose body is a JSON-RPC error: a
// 4xx is written in front of that layer, by a proxy, an auth layer, or
// the server's own HTTP handler before any session takes the request
// (the go-sdk's 400 and 404 on a session id, the TypeScript SDK's 400,
// 406 and 415), and an upstream that is hung behind them still gets it
// answered. So a 4xx is not counted as heard (see alive).
func throughMCP(status int) bool {
	return status == 0 || status >= 200 && status < 300
}

func (up *upstream) report(probe bool, o outcome) {
	up.mu.Lock()
	defer up.mu.Unlock()
	if probe {
		up.probing = false
	}
	switch o {
	case answered:
		up.failures = 0
		up.heard++
	case refused:
		// Neither a failure nor a sign of life: it leaves the count
		// (a front layer's refusals between a hung upstream's timeouts
		// must not keep its breaker closed), and a probe refused leaves
		// the breaker half-open, probed again.
	case failed:
		up.failures++
		if up.failures >= up.f.opts.Failures {
			up.openTill = time.Now().Add(up.f.opts.Cooldown)
		}
	}
	up.setStateLocked()
}

// heardCount is the number of answers the upstream gave so far (see
// upstream.heard).
func (up *upstream) heardCount() uint64 {
	up.mu.Lock()
	defer up.mu.Unlock()
	return up.heard
}

// maxLivenessWait bounds the wait for the ping of alive: the go-sdk (as
// most servers) answers a ping in its protocol layer, running no tool, so
// an upstream that is serving at all answers one at once.
const maxLivenessWait = 5 * time.Second

// alive reports whether the upstream showed it is alive since a call on
// cs, sent when heardCount was heard, went silent for its idle timeout d:
// it answered some other request meanwhile, or it answers a ping on cs
// now, within d (at least a second, at most maxLivenessWait). That call's
// timeout then is the call's own (a tool slow on its arguments, a caller
// asking for much), not a failure of the upstream: counted as one, a
// single caller's slow calls would open the upstream's breaker for every
// caller, and keep it open. An upstream that is dead, or hung (it takes
// requests and answers none), answers no ping, and its timeouts still
// open the breaker. Keeping timeouts per caller instead (as 429 back-offs
// are) would not do: callerKey is "" for every caller without
// identity_headers, and a hung upstream would be refused to each caller
// only after that caller's own timeouts. The cost: an upstream whose
// tools all hang while its protocol layer answers pings keeps its breaker
// closed, each call failing at its own timeout.
//
// The ping carries the caller's forwarded headers (ctx's), so that a 429
// it meets is that caller's back-off, not the whole upstream's. Only a
// ping answered through the upstream's MCP layer shows it alive: with a
// result, or with a JSON-RPC error (not one the SDK's transport makes,
// see transportCode), as call.verdict counts a call's (a server that does
// not implement ping answers it -32601, promptly). One refused with an
// HTTP 4xx (429 too: a proxy in front of a hung upstream answers those,
// see throughMCP), failing with no status, or with a 5xx (a proxy in
// front of a dead upstream) does not. Nor does an answer of that kind to
// another call count as heard (see call.verdict). A ping answered counts
// as heard: the other calls that went silent since heardCount was heard
// need not ping.
func (up *upstream) alive(ctx context.Context, cs *mcp.ClientSession, heard uint64, d time.Duration) bool {
	if up.heardCount() != heard {
		return true
	}
	var status atomic.Int32
	pctx := context.WithValue(up.f.ctx, statusKey{}, &status)
	if fwd, ok := ctx.Value(forwardKey{}).(http.Header); ok {
		pctx = context.WithValue(pctx, forwardKey{}, fwd)
	}
	pctx, cancel := context.WithTimeout(pctx, min(max(d, time.Second), maxLivenessWait))
	defer cancel()
	err := cs.Ping(pctx, nil)
	var je *jsonrpc.Error
	if err != nil && (!errors.As(err, &je) || transportCode(je.Code)) || !throughMCP(int(status.Load())) {
		return false
	}
	up.mu.Lock()
	up.heard++
	up.mu.Unlock()
	return true
}

// setStateLocked recomputes the state and tells Options.OnState of a
// change. up.mu is held.
func (up *upstream) setStateLocked() {
	now := time.Now()
	tripped := up.failures >= up.f.opts.Failures
	s := StateUp
	switch {
	case up.down:
		s = StateDown
	case tripped && now.Before(up.openTill) && !up.probing:
		s = StateOpen
	case tripped || up.probing: // cooldown over, or a probe in flight
		s = StateHalfOpen
	case now.Before(up.limited):
		s = StateLimited
	}
	if s != up.state {
		up.state = s
		if up.f.opts.OnState != nil {
			up.f.opts.OnState(up.cfg.Name, s)
		}
	}
}

func (up *upstream) health() Health {
	up.mu.Lock()
	defer up.mu.Unlock()
	up.setStateLocked() // time may have moved a state on (open → half open)
	h := Health{Name: up.cfg.Name, Transport: "http", State: up.state, Failures: up.failures, Restarts: up.restarts}
	if up.cfg.stdio() {
		h.Transport = "stdio"
	}
	switch up.state {
	case StateOpen:
		h.RetryAfter = up.openTill
	case StateLimited:
		h.RetryAfter = up.limited
	}
	if up.f.cat != nil {
		h.Tools = up.f.cat.toolCount(up)
	}
	return h
}

// httpTransport returns a new transport to the upstream (HTTP only),
// counting into w.
func (up *upstream) httpTransport(w *wireCount) mcp.Transport {
	base := up.f.opts.HTTPClient
	hc := &http.Client{
		Transport:     &headerTransport{base: base.Transport, up: up, wire: w},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Jar:           base.Jar,
	}
	return &mcp.StreamableClientTransport{Endpoint: up.cfg.URL, HTTPClient: hc, MaxRetries: 2}
}

// connect opens a session to the upstream (HTTP only) for ss (nil: the
// shared session). The session keeps its connecting context's values for
// its own requests (its event stream, its DELETE): it connects with none
// of the call's (the caller's identity, the call's status recorder), only
// its cancellation. It returns the session's SDK client too: one per
// session (see Federator.rootsChanged).
func (up *upstream) connect(ctx context.Context, ss *mcp.ServerSession) (*mcp.ClientSession, *mcp.Client, error) {
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	if d, ok := ctx.Deadline(); ok {
		var cancelD context.CancelFunc
		cctx, cancelD = context.WithDeadline(cctx, d)
		defer cancelD()
	}
	w := new(wireCount)
	c := up.f.newClient(up, ss, w)
	cs, err := c.Connect(cctx, up.httpTransport(w), &mcp.ClientSessionOptions{ProtocolVersion: upstreamProtocol})
	if err != nil {
		return nil, nil, err
	}
	up.f.track(cs, w)
	return cs, c, nil
}

// connectShared opens the upstream's shared session (for a stdio upstream:
// starts its process).
func (up *upstream) connectShared(ctx context.Context) error {
	var cs *mcp.ClientSession
	var pipe *stdioPipe
	var err error
	if up.cfg.stdio() {
		cs, pipe, err = up.startProcess(ctx)
	} else {
		cs, _, err = up.connect(ctx, nil)
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrStart, describe(up.cfg), redact.URLError(err))
	}
	up.mu.Lock()
	old := up.shared
	up.shared, up.pipe, up.init, up.down = cs, pipe, cs.InitializeResult(), false
	up.setStateLocked()
	up.mu.Unlock()
	if old != nil {
		up.f.closeLater(old)
	}
	if up.f.ctx.Err() != nil { // Close ran meanwhile: it did not see cs
		up.close()
	}
	if pipe == nil {
		began := time.Now()
		up.f.spawn(func() { up.watchShared(cs, began) })
	}
	up.f.resubscribe(up, cs)
	return nil
}

// Bounds of the waits between the restarts of an upstream's shared
// session, a process that exited (see supervise) or an HTTP session that
// ended by itself (see watchShared): restartFirstGap, doubling up to
// DefaultMaxRestartGap while each new one ends within restartReset of its
// start.
const (
	restartFirstGap = 100 * time.Millisecond
	restartReset    = time.Minute
)

// restartGap is the wait before restarting a session that began at began,
// gap before: back to restartFirstGap once it ran restartReset.
func restartGap(gap time.Duration, began time.Time) time.Duration {
	if time.Since(began) > restartReset {
		return restartFirstGap
	}
	return gap
}

// restart waits *gap, then starts the session under StartTimeout, again
// and again until it starts (true) or ctx ends (false). Before each start
// *gap is doubled, up to DefaultMaxRestartGap, so that it is the wait
// after the next failure, which failed is told (with the wait, *gap) for
// the log.
func (up *upstream) restart(ctx context.Context, gap *time.Duration, start func(context.Context) error, failed func(error)) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(*gap):
		}
		*gap = min(2**gap, DefaultMaxRestartGap)
		sctx, cancel := context.WithTimeout(ctx, up.f.opts.StartTimeout)
		err := start(sctx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		failed(err)
	}
}

// watchShared waits for the HTTP shared session cs to end. Ended by the
// Federator (dropped after a failed call, replaced, closed), nothing is
// left to do. Ended by itself (the SDK client fails it when the upstream
// restarted and lost it, or expired it), it would otherwise stay the
// shared session, failing every listing and holding subscriptions the
// upstream no longer has until a call happened to go through it: it is
// dropped and a new one opened, with backoff, which subscribes again and
// lists the upstream again (see sharedSession).
func (up *upstream) watchShared(cs *mcp.ClientSession, began time.Time) {
	_ = cs.Wait()
	up.mu.Lock()
	lost := up.shared == cs && up.f.ctx.Err() == nil
	if lost {
		up.shared = nil
		up.lostGap = restartGap(up.lostGap, began)
	}
	gap := max(up.lostGap, restartFirstGap)
	up.mu.Unlock()
	if !lost {
		return
	}
	up.f.log.Warn("federate: an upstream's shared session ended; reconnecting", "upstream", up.cfg.Name, "in", gap)
	up.restart(up.f.ctx, &gap, func(ctx context.Context) error {
		// Before the new session can end and read it.
		up.mu.Lock()
		up.lostGap = gap
		up.mu.Unlock()
		_, err := up.sharedSession(ctx)
		return err
	}, func(err error) {
		up.f.log.Warn("federate: cannot reconnect an upstream's shared session", "upstream", up.cfg.Name, "err", redact.URLError(err), "retry_in", gap)
	})
}

// sharedSession returns the shared session, reconnecting an HTTP upstream
// whose session was dropped.
func (up *upstream) sharedSession(ctx context.Context) (*mcp.ClientSession, error) {
	up.mu.Lock()
	cs := up.shared
	up.mu.Unlock()
	if cs != nil {
		return cs, nil
	}
	if up.cfg.stdio() {
		return nil, fmt.Errorf("upstream %q: process not running", up.cfg.Name)
	}
	// One reconnection at a time: the calls that found no session wait for
	// it rather than each opening one.
	up.connMu.Lock()
	defer up.connMu.Unlock()
	up.mu.Lock()
	cs = up.shared
	up.mu.Unlock()
	if cs != nil {
		return cs, nil
	}
	for attempt := 0; ; attempt++ {
		if err := up.connectShared(ctx); err != nil {
			return nil, err
		}
		up.mu.Lock()
		cs = up.shared
		up.mu.Unlock()
		switch {
		case cs != nil:
		case up.f.ctx.Err() != nil: // Close ran meanwhile and closed it
			return nil, fmt.Errorf("upstream %q: %w", up.cfg.Name, errClosing)
		case attempt == 0: // a failing call dropped it at once: once more
			continue
		default:
			return nil, fmt.Errorf("upstream %q: its new session was dropped as soon as it was opened, twice", up.cfg.Name)
		}
		break
	}
	// A new session may be a restarted server with other tools.
	up.f.spawn(func() { up.f.refresh(up) })
	return cs, nil
}

// drop forgets an HTTP session that failed if it is the shared one (a
// client's own is forgotten by its call: call.drop), so that the next
// call opens a new one, and closes it in the background (a graceful close
// waits for the other calls on it). A stdio upstream's session is its
// process: supervise alone replaces it, when the process exits; one bad
// answer must not restart a process every client shares.
func (up *upstream) drop(cs *mcp.ClientSession) {
	if up.cfg.stdio() {
		return
	}
	up.mu.Lock()
	if up.shared == cs {
		up.shared = nil
	}
	up.mu.Unlock()
	up.f.closeLater(cs)
}

// close ends the shared session; a stdio upstream's process is stopped
// whether or not the session's calls end (see endSession).
func (up *upstream) close() {
	up.mu.Lock()
	cs, pipe := up.shared, up.pipe
	up.shared, up.pipe = nil, nil
	up.mu.Unlock()
	switch {
	case cs == nil:
	case pipe != nil:
		up.endSession(cs, pipe)
	default:
		_ = cs.Close()
	}
}
