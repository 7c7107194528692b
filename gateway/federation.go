package gateway

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
)

// federation is the in-process MCP server that puts the servers of
// upstreams: behind one endpoint. The gateway forwards to it over
// in-memory pipes (no socket), exactly as it forwards to a single upstream
// over HTTP: every stage (authentication, scopes, limits, cache, metering,
// audit) runs unchanged, on the exposed names.
type federation struct {
	fed *federate.Federator
	srv *http.Server
	url string
	// rt is the transport of every request the gateway sends the
	// federation (the proxy's, session ends, cache warm-up).
	rt *http.Transport
	// auth is the Authorization header the federation requires: a random
	// secret of this process (defence in depth: the pipes are reachable
	// from this process only).
	auth string
	// timeout is the proxy's idle timeout towards the federation: the
	// longest upstream or tool timeout and a margin, so that the
	// federation's own timeouts (per upstream, per tool) are the ones that
	// fire, with their clearer errors.
	timeout time.Duration
	// limits is the configuration whose upstream limits a tool's name must
	// not misplace (attribution): the one in force, set by applied.
	limits *atomic.Pointer[policy.Config]
	// sessionTimeout ends a federation session that got no POST for this
	// long (the go-sdk's timer counts POSTs only): a backstop for sessions
	// the gateway never saw end, which its sweep keeps from ending those it
	// keeps (see touchEvery).
	sessionTimeout time.Duration
}

// minFederationSessionTimeout is the least of federation.sessionTimeout.
// The gateway ends its sessions itself, on its own idle timeout, which a
// reload may raise: the federation's must not end them first.
const minFederationSessionTimeout = 24 * time.Hour

// federationSessionTimeout is the federation's session timeout for a
// gateway started with sessions.idle_timeout idle.
func federationSessionTimeout(idle time.Duration) time.Duration {
	return max(addSat(idle, idle), minFederationSessionTimeout)
}

// addSat is a+b for non-negative durations, saturating at the largest
// duration instead of overflowing into a negative one: policy.Parse bounds
// the timeouts added here, but a Config built in code need not be.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// touchEvery is how often at most the sweep pings a session it keeps in
// the federation, so that the federation's timer (sessionTimeout, which
// counts POSTs only: a client listening on its GET stream sends none)
// never runs out under it. The sweep comes at least every sessionTimeout/8
// with a federation (sweepEvery), so a session is pinged at most
// sessionTimeout/2 after its previous ping or its start.
func (fd *federation) touchEvery() time.Duration { return fd.sessionTimeout / 4 }

// federationStates are the values of metrics.UpstreamState's state label.
var federationStates = []federate.State{federate.StateUp, federate.StateOpen, federate.StateHalfOpen, federate.StateDown, federate.StateLimited}

// startFederation connects to (and starts) the upstreams of cfg and serves
// them in this process; ctx bounds the start.
func startFederation(ctx context.Context, cfg *policy.Config, log *slog.Logger, m *metrics.Metrics) (*federation, error) {
	timeout := federationSessionTimeout(cfg.Sessions.IdleTimeout)
	opts := federate.Options{Logger: log, ToolTimeouts: map[string]time.Duration{},
		// The gateway sweeps idle sessions itself (a DELETE ends the
		// federation's); this catches any it did not see end.
		SessionTimeout: timeout}
	for _, u := range cfg.Upstreams {
		opts.Upstreams = append(opts.Upstreams, federate.Upstream{Name: u.Name, URL: u.URL, Headers: u.Headers,
			Command: u.Command, Env: u.Env, Timeout: u.Timeout, Prefix: u.Prefix})
	}
	for name, t := range cfg.Tools {
		if t.Timeout > 0 {
			opts.ToolTimeouts[name] = t.Timeout
		}
	}
	limits := new(atomic.Pointer[policy.Config])
	limits.Store(cfg)
	// Every name an upstream lists, at start (New fails) and later
	// (list_changed), against the configuration then in force.
	opts.AcceptTool = func(upstream, tool string) error { return attribution(limits.Load(), upstream, tool) }
	opts.OnState = func(upstream string, s federate.State) { setUpstreamState(m, upstream, s) }
	opts.OnCall = func(upstream string, o federate.Outcome) { m.UpstreamCalls.WithLabelValues(upstream, string(o)).Inc() }
	opts.OnDropped = func(method string) { m.NotificationsDropped.WithLabelValues(method).Inc() }
	for _, u := range cfg.Upstreams {
		setUpstreamState(m, u.Name, federate.StateUp)
	}
	fed, err := federate.New(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("gateway: upstreams: %w", err)
	}
	ln := newPipeListener()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret) // never fails (crypto/rand)
	fd := &federation{fed: fed, rt: ln.transport(), url: "http://federation.invalid/mcp", timeout: addSat(cfg.LongestCallTimeout(), 5*time.Second),
		auth: "Bearer " + hex.EncodeToString(secret), limits: limits, sessionTimeout: timeout}
	fd.srv = &http.Server{Handler: fd.guard(fed.Handler()), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := fd.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("federation server stopped", "err", err)
		}
	}()
	return fd, nil
}

// catalog is what checkAttribution reads of a federation: its tools and
// the upstream serving each.
type catalog interface {
	Tools() []string
	UpstreamOf(tool string) (upstream string, ok bool)
}

// checkAttribution refuses a catalog whose names the configuration would
// put under the wrong upstream: limits and scopes find a tool's upstream
// by its name (policy.Config.UpstreamOf, "tools:search__*"), so a bare
// upstream exposing "search__x" would be counted by search's limits and
// called by a token scoped to search's tools. It runs on every reload,
// whose upstreams may differ (at start and at every listing, the
// federation asks attribution of each name itself:
// federate.Options.AcceptTool). Prompts, scoped by name too
// ("prompts:search__*") but counted by no upstream's limits, are the
// federation's own check (federate.ErrMisattributed): it reads their names
// by the prefixes it started with, which a reload keeps.
func checkAttribution(cfg *policy.Config, fed catalog) error {
	for _, tool := range fed.Tools() {
		serving, _ := fed.UpstreamOf(tool)
		if err := attribution(cfg, serving, tool); err != nil {
			return err
		}
	}
	return nil
}

// attribution refuses tool, served by upstream serving, when cfg reads its
// name as another upstream's (whatever the limits: a scope naming that
// upstream's prefix would reach it), or as no upstream's while serving
// has limits (they would not count it).
func attribution(cfg *policy.Config, serving, tool string) error {
	named, ok := cfg.UpstreamOf(tool)
	switch {
	case ok && named != serving:
		return fmt.Errorf("gateway: upstreams: tool %q is served by upstream %q but its name reads as upstream %q's: %q's limits and scopes would take it for its own (give %q a prefix)", tool, serving, named, named, serving)
	case !ok && limited(cfg, serving):
		return fmt.Errorf("gateway: upstreams: tool %q is served by upstream %q but its name reads as no upstream's: %q's limits would not count it (give %q a prefix)", tool, serving, serving, serving)
	}
	return nil
}

// limited reports whether the upstream named upstream has limits in cfg.
func limited(cfg *policy.Config, upstream string) bool {
	for _, u := range cfg.Upstreams {
		if u.Name == upstream {
			return len(u.Limits) > 0
		}
	}
	return false
}

func setUpstreamState(m *metrics.Metrics, upstream string, s federate.State) {
	for _, st := range federationStates {
		v := 0.0
		if st == s {
			v = 1
		}
		m.UpstreamState.WithLabelValues(upstream, string(st)).Set(v)
	}
}

// guard refuses requests without the federation's secret.
func (fd *federation) guard(h http.Handler) http.Handler {
	want := []byte(fd.auth)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// check is checkAttribution of cfg against the federation's catalog (nil
// without a federation).
func (fd *federation) check(cfg *policy.Config) error {
	if fd == nil {
		return nil
	}
	return checkAttribution(cfg, fd.fed)
}

// applied records cfg as the configuration in force, whose limits later
// listings are checked against.
func (fd *federation) applied(cfg *policy.Config) {
	if fd != nil {
		fd.limits.Store(cfg)
	}
}

// effective returns the configuration the gateway's stages use: with
// upstreams:, the single upstream is the federation (its URL and secret;
// each upstream has its own headers; the proxy's idle timeout is the
// longest of theirs).
func (fd *federation) effective(cfg *policy.Config) *policy.Config {
	if fd == nil {
		return cfg
	}
	c := *cfg
	c.Upstream.URL = fd.url
	c.Upstream.Headers = map[string]string{"Authorization": fd.auth}
	c.Upstream.Timeout = fd.timeout
	return &c
}

// close stops the federation (its upstream sessions and stdio processes)
// and its server.
func (fd *federation) close() {
	if fd == nil {
		return
	}
	// The federation first: it ends its client sessions, whose event
	// streams would hold a graceful shutdown of the listener.
	fd.fed.Close()
	_ = fd.srv.Close()
	fd.rt.CloseIdleConnections()
}

// writeUpstreamHealth adds a line per upstream of upstreams: to /readyz.
// The gateway stays ready while upstreams fail: their tools fail fast with
// errors naming them, and the other upstreams keep serving.
func (g *Gateway) writeUpstreamHealth(w io.Writer) {
	if g.fed == nil {
		return
	}
	for _, h := range g.fed.fed.Health() {
		line := fmt.Sprintf("upstream %s (%s): %s, %d tools", h.Name, h.Transport, h.State, h.Tools)
		if h.Failures > 0 {
			line += fmt.Sprintf(", %d consecutive failures", h.Failures)
		}
		if !h.RetryAfter.IsZero() {
			line += ", retry after " + h.RetryAfter.UTC().Format(time.RFC3339)
		}
		if h.Restarts > 0 {
			line += fmt.Sprintf(", %d restarts", h.Restarts)
		}
		fmt.Fprintln(w, line)
	}
}

// Federation returns the federation of upstreams:, nil without it.
func (g *Gateway) Federation() *federate.Federator {
	if g.fed == nil {
		return nil
	}
	return g.fed.fed
}

// transport is the transport of the gateway's requests to its upstream:
// the federation's pipes, or nil (the default) without upstreams:.
func (fd *federation) transport() http.RoundTripper {
	if fd == nil {
		return nil
	}
	return fd.rt
}
