// Package gateway is mcpgate's http.Handler: it chains the stages of the
// request path (auth, parse, limits, forward) in front of one upstream MCP
// server and serves the admin, health and metrics endpoints.
//
// A Gateway holds no state that matters between requests beyond what its
// stores hold: run many instances behind a load balancer, sharing one Redis.
package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/audit"
	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
)

// Options configures a Gateway. Config and Auth are required; a nil or zero
// field otherwise means the documented default.
type Options struct {
	// Config is the loaded configuration.
	Config *policy.Config
	// Auth verifies callers' tokens.
	Auth *auth.Authenticator
	// SharedStore is the limit store shared by all instances (Redis). Nil
	// means in-process only: one instance, limits in memory.
	SharedStore limit.GuardedStore
	// Probe checks that the shared store answers (a PING). It drives /readyz
	// and closes the store breaker after an outage. Required with SharedStore.
	Probe func(ctx context.Context) error
	// LocalStore is the in-process store: the store itself without
	// SharedStore, the fallback of on_error: local with it. Nil: a new
	// memstore owned (and closed) by the Gateway.
	LocalStore limit.GuardedStore
	// AdminToken is the bearer token of /admin/*. Empty disables the admin
	// API (every call answers 401). SetAdminToken replaces it later.
	AdminToken string
	// Reload is called by POST /admin/reload; nil answers 501.
	Reload func(ctx context.Context) error
	// Usage is the durable usage store. When set, every admitted call is
	// metered per tenant and month, monthly quotas are enforced, and a
	// flusher writes the totals every Config.Usage.FlushInterval. Nil: no
	// metering, no quotas.
	Usage usage.Store
	// Cache holds the results of tools configured with a cache. Nil: an
	// in-process cache owned (and closed) by the Gateway.
	Cache *cache.Cache
	// SessionKey binds MCP session ids to the caller that opened them (see
	// DeriveSessionKey). Every instance must share it. Nil: a random key,
	// so a session works only through the instance that opened it.
	SessionKey []byte
	// Logger receives the gateway's logs; nil: slog.Default().
	Logger *slog.Logger
	// Metrics receives the gateway's metrics; nil: a new set.
	Metrics *metrics.Metrics
	// TracerProvider makes the spans of MCP requests (see docs/design.md,
	// Tracing); nil: tracing off, at no cost.
	TracerProvider trace.TracerProvider
	// Now is the clock of rate-limit headers; nil: time.Now.
	Now func() time.Time
}

// runtime is what a config reload replaces, swapped atomically.
type runtime struct {
	cfg   *policy.Config
	auth  *auth.Authenticator
	proxy *mcp.Proxy
	// outputs: the tools known to declare an outputSchema (kept by a
	// reload that keeps the upstream); nil unless some tier or tool
	// denies as a result, the only answer that reads it.
	outputs *toolSchemas
}

// Gateway is the mcpgate http.Handler. It is safe for concurrent use.
type Gateway struct {
	rt         atomic.Pointer[runtime]
	eng        *enforce.Engine
	probe      func(ctx context.Context) error
	adminToken atomic.Pointer[[]byte] // never nil; empty: admin API disabled (SetAdminToken)
	sessions   *sessionBinder
	inflight   inflight      // tools/call in progress, for notifications/cancelled
	order      *sessionOrder // a session's POST waits for its GET to be accepted upstream
	reload     func(ctx context.Context) error
	log        *slog.Logger
	metrics    *metrics.Metrics
	now        func() time.Time
	mux        *http.ServeMux
	stopAlerts context.CancelFunc // ends the background work: closes closing
	closing    <-chan struct{}    // closed by Close (inBackground)
	alerts     *alerter
	ready      atomic.Bool // false while the cache warms up
	closeOnce  sync.Once
	streams    streamSet // server-initiated streams (GET), ended on shutdown
	// tenantRequests counts each tenant's requests in progress
	// (server.max_requests_per_tenant).
	tenantRequests tenantRequests
	warming        sync.WaitGroup
	// startingBg guards bgClosed, set by Close before it waits for the
	// goroutines inBackground started: none starts after (a WaitGroup's
	// Go concurrent with its Wait at zero is a misuse).
	startingBg sync.Mutex
	bgClosed   bool
	applying   sync.Mutex // held by Apply
	// settling counts the tickets of cached calls whose caller left while
	// their own load goes on: Close waits for them before the final flush
	// (maxSettleWait), or their cost corrections would miss it.
	settling  sync.WaitGroup
	tracker   *sessionTracker
	stopSweep context.CancelFunc
	sweepDone chan struct{}
	audit     *audit.Logger // nil: no audit log
	// proxyWarned: the warning that forwarded headers met a derived OAuth
	// resource was logged (once per Gateway).
	proxyWarned atomic.Bool
	trace       *tracing    // nil: tracing off
	fed         *federation // nil: a single upstream (no upstreams:)
	// upstream sends every runtime's requests to the upstream: one
	// connection pool across reloads, which replace the mcp.Proxy but not
	// its client. A client per runtime left each old pool's idle
	// connections open (nothing closed them), and every reload reconnected.
	upstream *http.Client
}

// New builds a Gateway from opts. ctx bounds its start only (connecting
// to, or starting, the upstreams of opts.Config.Upstreams): cancelled, New
// stops what it started and returns an error wrapping ctx's.
func New(ctx context.Context, opts Options) (*Gateway, error) {
	if opts.Config == nil || opts.Auth == nil {
		return nil, errors.New("gateway: Options.Config and Options.Auth are required")
	}
	if opts.SharedStore != nil && opts.Probe == nil {
		return nil, errors.New("gateway: Options.Probe is required with a SharedStore")
	}
	g := &Gateway{
		probe:    opts.Probe,
		sessions: newSessionBinder(opts.SessionKey),
		order:    newSessionOrder(defaultOrderWait),
		reload:   opts.Reload,
		log:      opts.Logger,
		metrics:  opts.Metrics,
		now:      opts.Now,
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.metrics == nil {
		g.metrics = metrics.New()
	}
	if g.now == nil {
		g.now = time.Now
	}
	g.trace = newTracing(opts.TracerProvider)
	cfg := opts.Config
	if len(cfg.Upstreams) > 0 {
		fd, err := startFederation(ctx, cfg, g.log, g.metrics)
		if err != nil {
			return nil, err
		}
		g.fed = fd
		cfg = fd.effective(cfg)
	}
	g.alerts = newAlerter(opts.Config.Breaker.AlertWebhook, g.log, g.metrics)
	eng, err := enforce.New(enforce.Options{Config: cfg, Shared: opts.SharedStore, Probe: opts.Probe,
		Local: opts.LocalStore, Usage: opts.Usage, Cache: opts.Cache, Logger: g.log, Metrics: g.metrics,
		Tracer: g.trace.tracerOrNil(), Now: g.now, OnBreakerOpened: g.breakerOpened})
	if err != nil {
		g.fed.close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.eng = eng
	g.SetAdminToken(opts.AdminToken)
	bctx, bcancel := context.WithCancel(context.Background())
	g.stopAlerts, g.closing = bcancel, bctx.Done()
	go g.alerts.run(bctx)
	if err := g.openAudit(opts.Config.Audit.File); err != nil {
		g.Close()
		return nil, fmt.Errorf("gateway: audit.file: %w", err)
	}
	g.upstream = upstreamClient(g.fed)
	rt, err := newRuntime(cfg, opts.Auth, g.upstream)
	if err != nil {
		g.Close()
		return nil, err
	}
	if len(opts.Config.Cache.Warm) == 0 {
		g.ready.Store(true)
	} else {
		g.inBackground(func(ctx context.Context) { g.warm(ctx, cfg) })
	}
	if rt.outputs != nil {
		g.inBackground(func(ctx context.Context) { g.discoverOutputSchemas(ctx, cfg, rt.outputs) })
	}
	g.rt.Store(rt)
	g.startSessions()
	g.routes()
	return g, nil
}

// upstreamClient is the client of the gateway's requests to its upstream:
// over the federation's pipes with upstreams:, else mcp.NewClient's.
func upstreamClient(fd *federation) *http.Client {
	if rt := fd.transport(); rt != nil {
		return &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	return mcp.NewClient()
}

// newRuntime builds what a configuration needs per request. client carries
// the requests to the upstream (Gateway.upstream, shared by every runtime).
func newRuntime(cfg *policy.Config, a *auth.Authenticator, client *http.Client) (*runtime, error) {
	headers := make(http.Header, len(cfg.Upstream.Headers))
	for k, v := range cfg.Upstream.Headers {
		headers.Set(k, v)
	}
	proxy, err := mcp.NewProxy(mcp.ProxyOptions{Upstream: cfg.Upstream.URL, Headers: headers, Client: client,
		Timeout: cfg.Upstream.Timeout, MaxDuration: cfg.Upstream.MaxDuration})
	if err != nil {
		return nil, fmt.Errorf("gateway: upstream: %w", err)
	}
	run := &runtime{cfg: cfg, auth: a, proxy: proxy}
	if deniesAsResult(cfg) {
		run.outputs = &toolSchemas{} // read by result-mode denials only
	}
	return run, nil
}

// Apply swaps in a new configuration and authenticator (a reload). Requests
// in flight, open streams included, finish under the old ones; the next
// requests use the new. breaker.alert_webhook follows too. The settings
// that are read at start only (see restartOnly) keep their old values, in
// Config() too (inForce), and Apply logs a warning naming each one that
// changed; switching between upstream.url and upstreams: is refused
// (ErrUpstreamsSwitch). The admin token is not part of cfg: set it with
// SetAdminToken. Concurrent calls apply one after the other.
func (g *Gateway) Apply(cfg *policy.Config, a *auth.Authenticator) error {
	// One at a time: two at once could leave the engine on one file and
	// the runtime on the other.
	g.applying.Lock()
	defer g.applying.Unlock()
	if err := g.sameUpstreamKind(cfg); err != nil {
		return err
	}
	file := cfg // what the warnings below compare
	cfg = g.fed.effective(inForce(g.Config(), cfg))
	// The checks read the upstreams in force, not the file's: their
	// prefixes change only on restart, and they alone decide which
	// upstream's limits count a tool.
	if err := checkBareLimits(cfg); err != nil {
		return err
	}
	if err := g.fed.check(cfg); err != nil {
		return err
	}
	rt, err := newRuntime(cfg, a, g.upstream)
	if err != nil {
		return err
	}
	if err := g.eng.SetConfig(cfg); err != nil {
		return err
	}
	switch cur := g.rt.Load(); {
	case rt.outputs == nil:
	case cur.outputs != nil && sameUpstream(cur.cfg, cfg):
		rt.outputs = cur.outputs // the same tools: what was learnt still holds
	default:
		// Another upstream, or denials answered as results from now on: the
		// start-up listing has not run for this upstream (see New).
		g.inBackground(func(ctx context.Context) { g.discoverOutputSchemas(ctx, cfg, rt.outputs) })
	}
	old := g.rt.Swap(rt)
	g.fed.applied(cfg)
	g.alerts.setURL(cfg.Breaker.AlertWebhook)
	for _, field := range restartOnly(old.cfg, file) {
		g.log.Warn("this setting is read at start only: restart mcpgate to apply it", "field", field)
	}
	return nil
}

// ErrUpstreamsSwitch refuses a reload that switches between upstream.url
// and upstreams: (either way); the configuration in force stays.
var ErrUpstreamsSwitch = errors.New("gateway: upstreams: switching between upstream.url and upstreams needs a restart")

// ErrBareUpstreamLimits refuses a reload that gives limits to an upstream
// whose prefix in force is "" while another's is "" too; the configuration
// in force stays.
var ErrBareUpstreamLimits = errors.New("gateway: upstreams: limits on an upstream with prefix \"\" while another has prefix \"\" too")

// checkBareLimits is Parse's rule against limits on one of several bare
// upstreams (prefix ""), applied to the upstreams in force: a reload keeps
// the prefixes the federation started with, so a file that passed Parse
// with other prefixes may still leave two upstreams bare in force. Then a
// bare tool name reads as no upstream's (policy.Config.UpstreamOf) and the
// limits count none of its calls; the attribution check (federation.check)
// sees this only for the tools listed at the moment of the reload, while
// this refuses it whatever the upstreams list.
func checkBareLimits(cfg *policy.Config) error {
	bare, limited := policy.BareLimited(cfg.Upstreams)
	if len(limited) == 0 {
		return nil
	}
	names := make([]string, len(bare))
	for k, i := range bare {
		names[k] = cfg.Upstreams[i].Name
	}
	return fmt.Errorf("%w: upstreams %q are bare in force (prefixes change on restart only), so %q's limits would count none of its calls; give it a prefix and restart, or put the rules in tools.<name>.limits",
		ErrBareUpstreamLimits, names, cfg.Upstreams[limited[0]].Name)
}

// sameUpstreamKind refuses (ErrUpstreamsSwitch) a cfg that switches
// between upstream.url and upstreams:. Unlike the other settings read at
// start only, upstreams cannot just keep its old value while the rest of
// the file applies: the file names its tools by what the upstreams expose
// (<prefix><tool>), its rules were checked against the upstreams' limits
// (an upstream rule that a tool's rule repeats is one counter charged
// twice), and upstream.headers are the credential of upstream.url alone.
// Kept upstreams would meet a file written for none, or the reverse.
func (g *Gateway) sameUpstreamKind(cfg *policy.Config) error {
	switch federated := len(cfg.Upstreams) > 0; {
	case g.fed == nil && federated:
		return fmt.Errorf("%w (this gateway started with upstream.url)", ErrUpstreamsSwitch)
	case g.fed != nil && !federated:
		return fmt.Errorf("%w (this gateway started with upstreams)", ErrUpstreamsSwitch)
	}
	return nil
}

// inBackground runs fn on its own goroutine with a context that Close
// cancels; Close waits for it.
// After Close has begun (a reload that outlived the shutdown), fn is not
// run: the engine it would use is being closed.
func (g *Gateway) inBackground(fn func(ctx context.Context)) {
	g.startingBg.Lock()
	defer g.startingBg.Unlock()
	if g.bgClosed {
		return
	}
	g.warming.Go(func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-g.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		fn(ctx)
	})
}

// Config returns the configuration in force.
func (g *Gateway) Config() *policy.Config { return g.rt.Load().cfg }

// Close flushes usage a last time, writes the audit lines still buffered,
// and releases what the Gateway owns (the store probe, its own memory
// store, the audit file). It does not close the stores or
// authenticator passed in Options. Close the HTTP server first, so that no
// call is admitted after the final flush.
func (g *Gateway) Close() error {
	var err error
	g.closeOnce.Do(func() {
		g.EndStreams()
		defer g.fed.close()
		if g.stopSweep != nil {
			g.stopSweep()
			<-g.sweepDone
		}
		if g.stopAlerts != nil {
			g.stopAlerts() // also ends a warm-up in progress
		}
		g.startingBg.Lock()
		g.bgClosed = true
		g.startingBg.Unlock()
		g.warming.Wait()
		g.waitSettling()
		// the final flush: what was admitted reaches the usage store
		err = g.eng.Close()
		// last: the lines of calls that ended during the shutdown
		err = errors.Join(err, g.audit.Close())
		if g.upstream != nil {
			g.upstream.CloseIdleConnections()
		}
	})
	return err
}

// maxSettleWait bounds how long Close waits for the loads of cached calls
// whose callers left (Gateway.settling), early flush included. It comes
// after the HTTP server's shutdown grace (cli: 15 s) and before the final
// flush: 15 s + 5 s leaves the flush room within the 25 s a Kubernetes pod
// has between SIGTERM and SIGKILL (docs/deploy.md). A load is bounded by
// the upstream's timeouts; this only keeps a slow one from holding the
// flush past that.
const maxSettleWait = 5 * time.Second

// waitSettling waits for the settling tickets, up to maxSettleWait. While
// some are open it first flushes usage, so that a stop cut short during the
// wait (SIGKILL) loses their cost corrections at most, not every tenant's
// unflushed usage; the final flush (Engine.Close) then writes those
// corrections.
func (g *Gateway) waitSettling() {
	done := make(chan struct{})
	go func() {
		g.settling.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), maxSettleWait)
	defer cancel()
	if f := g.eng.Flusher(); f != nil {
		if err := f.Flush(ctx); err != nil {
			g.log.Warn("shutdown: usage flush before waiting for cached loads failed; the final flush tries again", "err", err)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		g.log.Error("shutdown: cached calls still loading after their callers left; their cost corrections miss the final usage flush", "waited", maxSettleWait)
	}
}

func (g *Gateway) routes() {
	mux := http.NewServeMux()
	mux.HandleFunc("/mcp", g.trace.wrap(g.protect(g.serveMCP)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", g.serveReady)
	mux.Handle("GET /metrics", g.metrics.Handler())
	g.adminRoutes(mux)
	g.wellKnownRoutes(mux)
	g.mux = mux
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.bodyBounded(w, r)
	g.mux.ServeHTTP(w, r)
}

// bodyBounded bounds the body of every request but the MCP endpoint's
// POSTs (protect bounds those, and lifts its deadline once the body is
// in): the server has no ReadTimeout (see HTTPServer), so a declared body
// that never comes would otherwise hold the connection for ever, busy,
// where the listener cannot take it back (net/http waits for up to 256
// KiB of it after the handler answers). Other POSTs (the admin API) get
// server.read_timeout for the whole request, which ends quickly; so does
// a request of any other method that declares a body (meaningless here),
// whose connection is closed after its answer. A GET stream without a
// body keeps no deadline: net/http's read of its connection is its watch
// for the client going away.
func (g *Gateway) bodyBounded(w http.ResponseWriter, r *http.Request) {
	post := r.Method == http.MethodPost
	if post && r.URL.Path == "/mcp" || !post && r.ContentLength == 0 {
		return
	}
	if t := g.rt.Load().cfg.Server.ReadTimeout; t > 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(t))
	}
	if !post {
		w.Header().Set("Connection", "close")
	}
}

func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !g.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "warming the cache")
		return
	}
	// A limit store that does not answer makes the instance unready only
	// under store.on_error closed, where the calls it governs are refused.
	// Under open and local it still serves them: every instance leaving
	// the load balancer at once would turn the degraded mode chosen into
	// an outage. The page says so either way.
	var storeDown error
	if g.probe != nil {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		storeDown = g.probe(ctx)
	}
	onError := g.rt.Load().cfg.Store.OnError
	if onError == "" {
		onError = policy.FailOpen // the default a tool without its own follows
	}
	if storeDown != nil && onError == policy.FailClosed {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "limit store unreachable: %v; store.on_error=closed refuses calls\n", storeDown)
		return
	}
	fmt.Fprintln(w, "ready")
	if storeDown != nil {
		fmt.Fprintf(w, "limit store unreachable: %v; decisions follow on_error=%s (or a tool's own on_error)\n", storeDown, onError)
	}
	// Neither does a result cache whose store is down: calls are served
	// uncached while its breaker is open.
	if c := g.eng.Cache(); c != nil && !c.StoreAvailable() {
		fmt.Fprintln(w, "result cache store unavailable: calls are served uncached")
	}
	g.writeUpstreamHealth(w)
	// A failing usage store does not stop calls (their usage waits in the
	// live counters), so the instance stays ready; the page says so.
	if h, metered := g.eng.UsageHealth(); metered && h.ConsecutiveFailures > 0 {
		since := "never"
		if !h.LastSuccess.IsZero() {
			since = h.LastSuccess.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "usage store failing: %d flushes in a row, last success %s; usage waits in the live counters\n", h.ConsecutiveFailures, since)
	}
}

// adminAuthorized checks the admin bearer token in constant time.
func (g *Gateway) adminAuthorized(r *http.Request) bool {
	want := *g.adminToken.Load()
	if len(want) == 0 {
		return false
	}
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h[len(prefix):]), want) == 1
}

// breakerOpened alerts a loop breaker that just opened (the engine logs
// and counts it).
func (g *Gateway) breakerOpened(b limit.BreakerSpec, st limit.BreakerState) {
	now := g.now()
	g.alerts.send(BreakerEvent{
		Event: "breaker_opened", Tenant: b.Tenant, Subject: b.Subject, Key: b.Key, Reason: st.Reason,
		Counts:   BreakerCounts{Denials: st.Denials, Failures: st.Failures, Identical: st.Identical},
		OpenedAt: now.UTC(), Until: now.Add(st.RetryAfter).UTC(),
	})
}

// EndStreams ends every server-initiated stream (GET /mcp) in progress, so
// that a graceful shutdown waits for calls only (register it with
// http.Server.RegisterOnShutdown). Clients reconnect to another instance.
func (g *Gateway) EndStreams() { g.streams.end() }

// Engine is the enforcement engine the Gateway drives.
func (g *Gateway) Engine() *enforce.Engine { return g.eng }
