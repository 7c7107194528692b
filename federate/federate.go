// Package federate puts many MCP servers behind one MCP endpoint.
//
// A Federator is an MCP server (built with the official Go SDK) whose tools,
// prompts, resources and resource templates are those of its upstreams:
// Streamable HTTP servers it calls, and stdio programs it runs. Tool and
// prompt names are exposed as Prefix+name; resource URIs pass unchanged and
// are routed by the list (or template) they came from; a URI or template
// that two upstreams list belongs to the first in configuration order. The gateway puts its
// Handler behind the enforcement engine, so limits, quotas, the loop breaker,
// the cache and metering see every upstream's traffic under the exposed
// names.
//
// Sessions: a client session of the Federator (MCP ≤ 2025-11-25) gets its own
// session on each HTTP upstream, opened at its first use and closed with the
// client's, so server-to-client requests (sampling, elicitation, roots),
// log messages and progress of an upstream reach the client that caused
// them, with ids mapped by the SDK on each side. A stdio upstream is one
// process, so one session shared by every client (see Upstream.Command);
// stateless clients (MCP 2026-07-28) use each upstream's shared session too.
// Nothing in a shared session's log messages and server-to-client requests
// says which client's call they belong to (a server may still be working
// for a call it answered): its log messages go to Options.Logger, at their
// level, and its sampling, elicitation and roots requests are refused,
// never sent to a client that might be another tenant. Its progress
// reaches the client whose call it is: its token names the call.
//
// Health: each upstream has its own circuit breaker. Consecutive transport
// failures or timeouts open it (a timeout only while the upstream answers
// nothing, not even a ping: one caller's slow calls must not open it for
// all); its tools then fail at once with a tool error naming the upstream
// (the other upstreams are untouched); after the cooldown one probe call
// is let through. An upstream that answers HTTP 429
// with Retry-After is not called again before that time by the caller it
// answered — the tenant and subject forwarded with the request (see
// ForwardHeaders), which the upstream may limit on — or, for a request
// that carried no identity, by anyone; callers refused are told when to
// retry.
package federate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/redact"
	gwmcp "github.com/mcpgate/mcpgate/mcp"
)

// Defaults for Options.
const (
	DefaultTimeout       = 60 * time.Second
	DefaultStartTimeout  = 30 * time.Second
	DefaultFailures      = 5
	DefaultCooldown      = 10 * time.Second
	DefaultMaxRestartGap = 30 * time.Second
	// DefaultSessionTimeout is long: the gateway ends the sessions it
	// sweeps itself (a DELETE); this bounds those of clients that vanish.
	DefaultSessionTimeout = time.Hour
	// DefaultRelayWait is long enough for a person to read and answer a
	// sampling or elicitation request.
	DefaultRelayWait = 10 * time.Minute
)

// upstreamProtocol is the protocol version the Federator speaks to its
// upstreams: the newest with sessions, so that server-to-client requests
// can be relayed.
const upstreamProtocol = "2025-11-25"

// Errors New and the calls return; check them with errors.Is.
var (
	// ErrConfig means Options are invalid (the message names the field).
	ErrConfig = errors.New("federate: invalid options")
	// ErrStart means an upstream could not be reached or started at boot.
	ErrStart = errors.New("federate: upstream did not start")
	// ErrConflict means two upstreams expose the same tool or prompt name.
	ErrConflict = errors.New("federate: two upstreams expose the same name")
)

// Upstream is one MCP server behind the Federator. Exactly one of URL and
// Command is set.
type Upstream struct {
	// Name identifies the upstream in errors, logs, health and metrics:
	// [a-z0-9-]+.
	Name string
	// URL is a Streamable HTTP endpoint.
	URL string
	// Headers are set on every HTTP request to URL (its credentials).
	Headers map[string]string
	// Command is the argv of a stdio server. The Federator runs one process
	// per upstream, started by New and shared by every client session: a
	// stdio server holds one MCP session, and a process per client would
	// put a process start on a client's first call; so the server cannot
	// ask a client for sampling, elicitation or roots, and its log
	// messages go to Options.Logger (see the package doc). When it exits
	// it is restarted with backoff (100ms doubling to
	// DefaultMaxRestartGap), and what it left in its process group is
	// stopped; its stderr goes to the log, line by line. A process that
	// reads nothing of a pending request for the longest idle timeout of
	// its calls (Timeout, ToolTimeouts) is killed and restarted.
	Command []string
	// Env is the process's environment (Command only), with the few
	// variables of mcpgate's own that programs need (PATH, HOME, locale,
	// TZ, temp dirs; see baseEnv): nothing else of mcpgate's environment,
	// which holds its secrets, reaches the server.
	Env map[string]string
	// Timeout is the idle timeout of one call: it fails when the upstream
	// sends nothing for this long; a progress notification starts it again.
	// Zero means DefaultTimeout.
	Timeout time.Duration
	// Prefix is prepended to the upstream's tool and prompt names.
	Prefix string
}

func (u Upstream) stdio() bool { return len(u.Command) > 0 }

// Options configures a Federator. Only Upstreams is required.
type Options struct {
	Upstreams []Upstream
	// ToolTimeouts overrides Upstream.Timeout for the tools it names
	// (exposed names).
	ToolTimeouts map[string]time.Duration
	// AcceptTool, when set, is asked about every tool an upstream exposes
	// (its exposed name), when New lists the upstreams and at every later
	// listing (list_changed, a reconnect, a restart): an error keeps the
	// tool out, as a name another upstream exposes is (New fails; later,
	// it is logged and not exposed). The gateway refuses a name its
	// limits would count under another upstream. It must be safe for
	// concurrent use.
	AcceptTool func(upstream, tool string) error
	// Failures is how many consecutive failures (transport errors and
	// timeouts of an upstream that answers nothing else, not even a ping;
	// not tool errors or JSON-RPC errors) open an upstream's breaker. Zero
	// means DefaultFailures.
	Failures int
	// Cooldown is how long an open breaker refuses calls before a probe.
	// Zero means DefaultCooldown.
	Cooldown time.Duration
	// StartTimeout bounds the connection to each upstream at boot (a stdio
	// process's start and initialize included). Zero means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// Name is the server name reported to clients; "" means "mcpgate".
	Name string
	// Logger receives upstream failures, restarts, stdio stderr and the
	// log messages of shared upstream sessions. nil means slog.Default().
	Logger *slog.Logger
	// HTTPClient sends requests to HTTP upstreams; nil means a pooled
	// client. Its Transport is wrapped to see 429 answers.
	HTTPClient *http.Client
	// SessionTimeout ends a client session idle this long (with its
	// upstream sessions): that got no POST for this long, for the go-sdk's
	// timer counts POSTs only (a client listening on its GET stream sends
	// none). Zero means DefaultSessionTimeout.
	SessionTimeout time.Duration
	// RelayWait bounds how long a sampling, elicitation or roots request
	// an upstream sends a client waits for the client's answer: the idle
	// timeouts of the calls in flight on that upstream session wait
	// meanwhile (any of them may be the one asking), and a client that
	// never answers must not hold them for ever. Past it the upstream gets
	// an error. Zero means DefaultRelayWait.
	RelayWait time.Duration
	// MaxRequestBytes bounds the body of a request the Handler reads: a
	// larger one is refused with 413. Zero means no bound of the
	// Federator's own: the gateway serves the Handler behind its own,
	// upstream.max_body_bytes, which changes live, and reads each body
	// whole before passing it on; a fixed second bound here (the SDK's
	// default is 4 MiB) would refuse requests the gateway accepted.
	MaxRequestBytes int64
	// OnCall, when set, is told how each request sent (or refused) to an
	// upstream ended: one of the Outcome values. It must not block.
	OnCall func(upstream string, outcome Outcome)
	// OnState, when set, is called when an upstream's health state
	// changes (for metrics); it must not block.
	OnState func(upstream string, state State)
	// OnDropped, when set, is told of each notification (by its method)
	// that was not relayed to a client session because that session had
	// MaxPending notifications waiting already: a client that stops
	// reading. It must not block.
	OnDropped func(method string)
}

var nameRE = regexp.MustCompile(`^[a-z0-9-]+$`)

func (o *Options) validate() error {
	if len(o.Upstreams) == 0 {
		return fmt.Errorf("%w: no upstreams", ErrConfig)
	}
	seen := map[string]bool{}
	for i, u := range o.Upstreams {
		switch {
		case !nameRE.MatchString(u.Name):
			return fmt.Errorf("%w: upstreams[%d]: name %q: want [a-z0-9-]+", ErrConfig, i, u.Name)
		case seen[u.Name]:
			return fmt.Errorf("%w: upstreams[%d]: name %q used twice", ErrConfig, i, u.Name)
		case (u.URL == "") == (len(u.Command) == 0):
			return fmt.Errorf("%w: upstream %q: set exactly one of URL and Command", ErrConfig, u.Name)
		case u.stdio() && u.Command[0] == "":
			return fmt.Errorf("%w: upstream %q: empty command", ErrConfig, u.Name)
		case u.Timeout < 0:
			return fmt.Errorf("%w: upstream %q: negative timeout", ErrConfig, u.Name)
		}
		seen[u.Name] = true
	}
	if o.Failures < 0 || o.Cooldown < 0 || o.StartTimeout < 0 || o.MaxRequestBytes < 0 {
		return fmt.Errorf("%w: negative Failures, Cooldown, StartTimeout or MaxRequestBytes", ErrConfig)
	}
	return nil
}

// Federator serves the union of its upstreams as one MCP server. Its
// methods are safe for concurrent use.
type Federator struct {
	opts      Options
	log       *slog.Logger
	ups       []*upstream
	cat       *catalog
	stateful  *mcp.Server // sessions: MCP ≤ 2025-11-25
	stateless *mcp.Server // MCP 2026-07-28: every request its own session
	handler   http.Handler
	sessions  sessionTable
	progress  progressTable
	inflight  inflightTable
	wires     wireTable
	subs      subscriptions
	outboxes  outboxes
	ctx       context.Context // ends at Close: the supervisors' lifetime
	// installed is closed once the catalog is built and installed: a
	// refresh (an upstream's list_changed may come during New) waits for it.
	installed chan struct{}
	// installMu is held from a catalog update through its install on the
	// servers (refreshOnce, installAll): installs apply in the catalog's
	// order.
	installMu sync.Mutex
	stop      context.CancelFunc
	wg        sync.WaitGroup // the goroutines of spawn
	procs     sync.WaitGroup // the watches of stdio processes (see upstream.watch)
	spawnMu   sync.Mutex
	closed    bool // no more spawns
	closeOnce sync.Once
}

// New connects to every upstream (starting the stdio ones), lists what each
// exposes and returns a Federator serving the union. An upstream that cannot
// be reached or started within Options.StartTimeout fails New with ErrStart
// naming it; two upstreams exposing the same name fail it with
// ErrConflict naming both. Close the Federator to stop the processes.
func New(ctx context.Context, opts Options) (*Federator, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	setDefaults(&opts)
	f := &Federator{opts: opts, log: opts.Logger, installed: make(chan struct{})}
	f.ctx, f.stop = context.WithCancel(context.Background())
	f.sessions.init()
	f.progress.init()
	f.subs.by, f.subs.watched, f.subs.held = map[subKey]*subState{}, map[*mcp.ServerSession]bool{}, map[*mcp.ServerSession]subsHeld{}
	for _, u := range opts.Upstreams {
		f.ups = append(f.ups, newUpstream(f, u))
	}
	if err := f.connectAll(ctx); err != nil {
		f.Close()
		return nil, err
	}
	cat, err := f.buildCatalog(ctx)
	if err != nil {
		f.Close()
		return nil, err
	}
	f.cat = cat
	f.stateful, f.stateless = f.newServer(false), f.newServer(true)
	f.installAll()
	f.handler = f.newHandler()
	close(f.installed)
	for _, up := range f.ups {
		if up.cfg.stdio() {
			f.spawn(func() { up.supervise(f.ctx) })
		}
	}
	f.spawn(f.tick)
	return f, nil
}

// tick moves the states that change with time alone (an open breaker's
// cooldown ending, a 429's Retry-After passing) every second, so that
// Options.OnState (the gateway's metrics) sees them without waiting for a
// call, and forgets the callers' 429 back-offs that are over.
func (f *Federator) tick() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		for _, up := range f.ups {
			up.mu.Lock()
			up.pruneLimitedLocked(now) // entries end at their retry time
			up.setStateLocked()
			up.mu.Unlock()
		}
	}
}

// closeLater closes an upstream session in the background: a graceful
// close waits for the calls still on it, and its caller must not.
func (f *Federator) closeLater(cs *mcp.ClientSession) {
	if !f.spawn(func() { _ = cs.Close() }) {
		_ = cs.Close() // closed: nothing left to wait for
	}
}

// spawn runs fn in a goroutine that Close waits for and reports true;
// after Close it does nothing and reports false.
func (f *Federator) spawn(fn func()) bool {
	f.spawnMu.Lock()
	defer f.spawnMu.Unlock()
	if f.closed {
		return false
	}
	f.wg.Go(fn)
	return true
}

func setDefaults(o *Options) {
	for i := range o.Upstreams {
		if o.Upstreams[i].Timeout == 0 {
			o.Upstreams[i].Timeout = DefaultTimeout
		}
	}
	if o.Failures == 0 {
		o.Failures = DefaultFailures
	}
	if o.Cooldown == 0 {
		o.Cooldown = DefaultCooldown
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.Name == "" {
		o.Name = "mcpgate"
	}
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = DefaultSessionTimeout
	}
	if o.RelayWait <= 0 {
		o.RelayWait = DefaultRelayWait
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HTTPClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		o.HTTPClient = &http.Client{Transport: tr}
	}
}

// connectAll opens the shared session of every upstream, in parallel.
func (f *Federator) connectAll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.opts.StartTimeout)
	defer cancel()
	errs := make([]error, len(f.ups))
	var wg sync.WaitGroup
	for i, up := range f.ups {
		wg.Go(func() { errs[i] = up.connectShared(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Handler returns the Streamable HTTP handler of the federated server:
// sessions for clients up to MCP 2025-11-25, stateless for 2026-07-28.
func (f *Federator) Handler() http.Handler { return f.handler }

func (f *Federator) newHandler() http.Handler {
	maxBody := f.opts.MaxRequestBytes
	if maxBody == 0 {
		maxBody = -1 // the SDK's "none" (see Options.MaxRequestBytes)
	}
	stateful := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return f.stateful },
		&mcp.StreamableHTTPOptions{Logger: f.sdkLogger(), SessionTimeout: f.opts.SessionTimeout, MaxRequestBodyBytes: maxBody})
	stateless := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return f.stateless },
		&mcp.StreamableHTTPOptions{Stateless: true, Logger: f.sdkLogger(), PropagateRequestCancellation: true, MaxRequestBodyBytes: maxBody})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(gwmcp.HeaderSessionID) == "" && r.Method == http.MethodPost && !isInitialize(r) {
			// A 2026-07-28 client has no session, nor has an older client
			// of a stateless server (a request other than initialize,
			// without a session id): each request is the whole exchange.
			// The SDK ends its handlers with the request for 2026-07-28
			// only; its calls end with it for every version (see
			// hangUpKey).
			stateless.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), hangUpKey{}, r.Context())))
			return
		}
		stateful.ServeHTTP(w, r)
	})
}

// hangUpKey is the context key of the HTTP request of a stateless
// client's request. Its handler's context does not end when the client
// hangs up (the SDK ties the two for MCP 2026-07-28 only), yet no answer
// can reach the client any more: its handler ends with the HTTP request
// (endWithRequest), so that the SDK client tells the upstream it is cancelled,
// rather than have the upstream run it for nobody.
type hangUpKey struct{}

// isInitialize reports whether r's body is an initialize request, leaving
// the body readable again, whole. It reads at most initializePeek bytes: a
// longer body is not an initialize (none is that large) and goes on with
// the rest of it unread. A body that cannot be read is not one (the
// stateless handler then reads the same error and answers it).
//
// A request of MCP 2026-07-28 or later names its method in Mcp-Method,
// which both SDK handlers check against the body (a mismatch is refused
// either way): its body, every stateless client's request, is not read
// twice.
func isInitialize(r *http.Request) bool {
	if r.Header.Get(gwmcp.HeaderProtocolVersion) >= headerMethodVersion {
		if m := r.Header.Get(gwmcp.HeaderMethod); m != "" {
			return m == "initialize"
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, initializePeek))
	// What was read, then what was not: a body past the peek (the gateway
	// may accept larger ones, see Options.MaxRequestBytes) or a read error
	// reaches the handler as it came. The server closes the original.
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	if err != nil || int64(len(body)) == initializePeek || !bytes.Contains(body, []byte("initialize")) {
		return false
	}
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == "initialize"
}

// initializePeek is the most of a request's body isInitialize reads.
const initializePeek = 16 << 20

// headerMethodVersion is the first protocol version whose requests carry
// Mcp-Method (checked by the SDK).
const headerMethodVersion = "2026-07-28"

func (f *Federator) sdkLogger() *slog.Logger { return f.log.With("component", "federate") }

// Close ends every client and upstream session and stops the stdio
// processes (stdin closed, then SIGTERM to the process group after 5s,
// then SIGKILL after 5s more; what a process leaves in its group gets
// SIGTERM once it exited, then SIGKILL), without waiting for calls a
// process does not read. It is idempotent.
func (f *Federator) Close() error {
	f.closeOnce.Do(func() {
		f.spawnMu.Lock()
		f.closed = true
		f.spawnMu.Unlock()
		f.stop()
		// The upstreams first: a client session's Close waits for its
		// calls, and a call whose request a stdio process does not read
		// ends only when the process is stopped. Each on its own: a
		// process may take stopWait to exit.
		var ups sync.WaitGroup
		for _, up := range f.ups {
			ups.Go(up.close)
		}
		ups.Wait()
		for _, srv := range []*mcp.Server{f.stateful, f.stateless} {
			if srv == nil {
				continue
			}
			for ss := range srv.Sessions() {
				_ = ss.Close()
			}
		}
		f.sessions.closeAll()
		f.wg.Wait()
		// After the supervisors ended: no process starts any more.
		f.procs.Wait()
	})
	return nil
}

// Outcome is how a request to an upstream ended, for metrics.
type Outcome string

// The outcomes of Options.OnCall.
const (
	OutcomeOK        Outcome = "ok"        // a result (a tool error included)
	OutcomeError     Outcome = "error"     // a JSON-RPC error or a refusal (HTTP 4xx) of the upstream
	OutcomeRefused   Outcome = "refused"   // not sent: breaker open, 429 back-off, process down, no connection
	OutcomeFailed    Outcome = "failed"    // sent, then a timeout or a broken connection
	OutcomeCancelled Outcome = "cancelled" // the client cancelled or went away
	OutcomeRetried   Outcome = "retried"   // the upstream had lost the session: sent again on a new one
)

// State is an upstream's health.
type State string

// The states of an upstream.
const (
	StateUp       State = "up"        // calls go through
	StateOpen     State = "open"      // the breaker refuses calls until its cooldown ends
	StateHalfOpen State = "half_open" // one probe call is let through
	StateDown     State = "down"      // a stdio process is not running (being restarted)
	StateLimited  State = "limited"   // the upstream answered 429: no call before RetryAfter
)

// Health is one upstream's state, for /readyz and metrics.
type Health struct {
	Name       string    `json:"name"`
	Transport  string    `json:"transport"` // "http" or "stdio"
	State      State     `json:"state"`
	Failures   int       `json:"consecutive_failures"`
	RetryAfter time.Time `json:"retry_after,omitzero"` // when State is open or limited
	Restarts   int       `json:"restarts,omitempty"`   // stdio: processes started after the first
	Tools      int       `json:"tools"`
}

// Health returns every upstream's state, in configuration order.
func (f *Federator) Health() []Health {
	out := make([]Health, 0, len(f.ups))
	for _, up := range f.ups {
		out = append(out, up.health())
	}
	return out
}

// UpstreamOf returns the name of the upstream serving the exposed tool
// name, and false for a name no upstream exposes.
func (f *Federator) UpstreamOf(tool string) (string, bool) {
	r, ok := f.cat.tool(tool)
	if !ok {
		return "", false
	}
	return r.up.cfg.Name, true
}

// Tools returns the exposed tool names, sorted.
func (f *Federator) Tools() []string {
	names := f.cat.toolNames()
	slices.Sort(names)
	return names
}

func describe(u Upstream) string {
	if u.stdio() {
		return fmt.Sprintf("upstream %q (command %s)", u.Name, strings.Join(u.Command, " "))
	}
	return fmt.Sprintf("upstream %q (%s)", u.Name, redact.Origin(u.URL)) // the URL may hold a key
}
