// Package loadgen measures mcpgate end to end, in one process and one run:
// calls per second and latency percentiles of MCP tools/call requests sent
// over real HTTP on loopback to the demo upstream directly, through a bare
// httputil.ReverseProxy (the cost of the HTTP hop alone), through gateways
// built as `mcpgate serve` builds them (memory store, Redis store), and the
// denial path (a tenant whose limit is exhausted: every call a 429).
//
// Start starts the servers (an Env); Drive sends the load to one Target;
// Run interleaves targets over rounds and Results.Print reports medians and
// ratios.
package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/gateway"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// Target names, in the order Run interleaves them.
const (
	Direct     = "direct"
	GatewayMem = "gateway-mem"
	// GatewayMemTraced is gateway-mem with tracing on (Options.Tracing).
	GatewayMemTraced = "gateway-mem-traced"
	GatewayRed       = "gateway-redis"
	DenyMem          = "deny-mem"
	DenyRedis        = "deny-redis"
	tenantTier       = "bench"
	deniedTier       = "exhausted"
	deniedTenant     = "exhausted-tenant"
)

// Rule sets the gateways can be configured with.
const (
	// RulesLayered is the shape of the demo and example configs: two
	// tenant-scoped rules (one script call) and one global rule (a second
	// script call, on one hot key).
	RulesLayered = "layered"
	// RulesSingle is one per-tenant rule: one script call per request.
	RulesSingle = "single"
)

// configTemplate is the gateways' config; every limit is far above what a
// run can reach, except the exhausted tier's, which admits one call a day.
// Everything else is the defaults of `mcpgate serve`, except store.timeout.
const configTemplate = `listen: 127.0.0.1:0
upstream:
  url: UPSTREAM
  identity_headers: true
auth:
  jwt:
    hs256_secret_env: SECRETENV
store:
  # 1s rather than the 25ms default: on this shared 2-core machine a starved
  # Take can miss 25ms, and a call admitted without Redis (on_error: open,
  # then the store breaker) would be measured as a cheaper gateway-redis call.
  timeout: 1s
  on_error: open
default_tier: ` + tenantTier + `
tiers:
  ` + tenantTier + `:
    limits:
RULES
  ` + deniedTier + `:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 1, period: 24h}
GLOBAL`

// ruleSets are the tenant rules (RULES) and global rules (GLOBAL) of each
// rule set.
var ruleSets = map[string][2]string{
	RulesSingle: {`      - {name: per_tenant, per: tenant, algorithm: gcra, limit: 1000000000, period: 1s}`, ""},
	RulesLayered: {`      - {name: per_tenant, per: tenant, algorithm: gcra, limit: 1000000000, period: 1s}
      - {name: per_tool, per: tenant_tool, algorithm: token_bucket, limit: 1000000000, period: 1s}`,
		`global:
  - {name: all_tenants, algorithm: gcra, limit: 1000000000, period: 1s}
`},
}

// Options configures an Env. The zero value means RulesLayered and no Redis.
type Options struct {
	// Rules is RulesLayered or RulesSingle; "" means RulesLayered.
	Rules string
	// RedisAddr is a redis-server (host:port) for the Redis targets; ""
	// leaves them out.
	RedisAddr string
	// Tenants is the number of tenants (one token each) the callers spread
	// over; 0 means 64.
	Tenants int
	// Logger receives the servers' warnings; nil discards them.
	Logger *slog.Logger
	// RedisCPU, when set, reports the CPU time the redis-server at
	// RedisAddr has used so far; results then carry its cost per call.
	RedisCPU func() (time.Duration, error)
	// NoUsage leaves usage metering out. By default each gateway meters
	// every admitted call into its own SQLite usage store (in a temporary
	// directory), as `mcpgate serve` does with its default usage.store.
	NoUsage bool
	// Stdio, when set, is the path of bench/cmd/stdioserver (see
	// BuildStdioServer): it adds the stdio-direct and fed-stdio targets.
	Stdio string
	// Federation adds the fed-1 and fed-3 targets (see FedOne): gateway-mem
	// fronting one, then three, upstreams through upstreams:.
	Federation bool
	// Tracing adds the gateway-mem-traced target: gateway-mem with
	// OpenTelemetry tracing on as `mcpgate serve` turns it on from the
	// OTEL_* environment, exporting over OTLP/HTTP to a receiver in this
	// process that discards what it is sent.
	Tracing bool
}

// Target is one endpoint under load.
type Target struct {
	Name string
	URL  string
	// Tokens are bearer tokens, one per tenant; caller i uses Tokens[i%len].
	Tokens []string
	// Status is the HTTP status every call must get.
	Status int

	// degraded, for a gateway, counts its limit decisions taken without
	// the shared store (store errors or timeouts under on_error: open).
	degraded func() float64
	// redisCPU is Options.RedisCPU.
	redisCPU func() (time.Duration, error)
	// drive, when set, measures the target instead of HTTP calls to URL
	// (stdio-direct).
	drive func(ctx context.Context, workers int, warmup, d time.Duration) Result
}

// Env is the servers of a run: the demo upstream and the gateways, each on
// its own loopback listener. Close stops them.
type Env struct {
	Targets []Target

	closers []func()
}

// server serves h on a new loopback listener, with pprof labels naming it so
// a CPU profile of the process can be split by server (go tool pprof
// -tagfocus server=NAME).
func (e *Env) server(name string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	labels := pprof.Labels("server", name)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pprof.Do(r.Context(), labels, func(context.Context) { h.ServeHTTP(w, r) })
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.Serve(ln)
	e.closers = append(e.closers, func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/mcp", nil
}

// secretEnvs numbers the environment variables of the Envs' secrets.
var secretEnvs atomic.Int64

// Start starts the upstream and the gateways. The secret of the tokens is
// random and set in the process environment (a variable of its own per
// Env), which the config names, as `mcpgate serve` reads it.
func Start(ctx context.Context, opts *Options) (_ *Env, err error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Rules == "" {
		o.Rules = RulesLayered
	}
	rules, ok := ruleSets[o.Rules]
	if !ok {
		return nil, fmt.Errorf("loadgen: unknown rule set %q (want %s or %s)", o.Rules, RulesLayered, RulesSingle)
	}
	if o.Tenants <= 0 {
		o.Tenants = 64
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Env{}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()

	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upURL, err := e.server("upstream", up.Handler())
	if err != nil {
		return nil, err
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	secret := hex.EncodeToString(raw)
	secretEnv := fmt.Sprintf("MCPGATE_LOADGEN_SECRET_%d", secretEnvs.Add(1))
	os.Setenv(secretEnv, secret)
	e.closers = append(e.closers, func() { os.Unsetenv(secretEnv) })
	tokens := make([]string, o.Tenants)
	for i := range tokens {
		if tokens[i], err = token(secret, fmt.Sprintf("tenant-%d", i), tenantTier); err != nil {
			return nil, err
		}
	}
	denied, err := token(secret, deniedTenant, deniedTier)
	if err != nil {
		return nil, err
	}
	e.Targets = append(e.Targets, Target{Name: Direct, URL: upURL, Tokens: tokens, Status: http.StatusOK})
	if err := e.addBareProxy(upURL, tokens, o.Logger); err != nil {
		return nil, err
	}

	text := strings.NewReplacer("UPSTREAM", upURL, "SECRETENV", secretEnv, "RULES", rules[0], "GLOBAL", rules[1]).Replace(configTemplate)
	// add serves a gateway of cfgText as target name (and its exhausted
	// tenant as deny, unless "").
	add := func(name, deny, cfgText string, tp trace.TracerProvider) error {
		g, err := newGateway(ctx, cfgText, !o.NoUsage, o.Logger, tp)
		if err != nil {
			return fmt.Errorf("loadgen: %s: %w", name, err)
		}
		e.closers = append(e.closers, g.close)
		u, err := e.server(name, g.gw)
		if err != nil {
			return err
		}
		e.Targets = append(e.Targets, Target{Name: name, URL: u, Tokens: tokens, Status: http.StatusOK, degraded: g.degraded})
		if deny != "" {
			e.Targets = append(e.Targets, Target{Name: deny, URL: u, Tokens: []string{denied}, Status: http.StatusTooManyRequests, degraded: g.degraded})
		}
		return nil
	}
	if err := add(GatewayMem, DenyMem, text, nil); err != nil {
		return nil, err
	}
	if o.Tracing {
		tp, err := e.startTracing(ctx)
		if err != nil {
			return nil, err
		}
		if err := add(GatewayMemTraced, "", text, tp); err != nil {
			return nil, err
		}
	}
	if o.Federation {
		var others []string
		for _, name := range []string{"upstream-b", "upstream-c"} {
			u, err := e.server(name, upstream.New(&upstream.Options{Stateless: true, JSONResponse: true}).Handler())
			if err != nil {
				return nil, err
			}
			others = append(others, u)
		}
		addFed := func(name, cfgText string) error { return add(name, "", cfgText, nil) }
		if err := e.addFederation(addFed, text, upURL, others); err != nil {
			return nil, err
		}
	}
	if o.Stdio != "" {
		drive, err := e.stdioDriver(ctx, o.Stdio)
		if err != nil {
			return nil, err
		}
		e.Targets = append(e.Targets, Target{Name: StdioDirect, Tokens: tokens, Status: http.StatusOK, drive: drive})
		if err := add(FedStdio, "", stdioConfig(text, upURL, o.Stdio), nil); err != nil {
			return nil, err
		}
	}
	if o.RedisAddr != "" {
		withRedis := strings.Replace(text, "store:\n", "store:\n  redis: "+o.RedisAddr+"\n", 1)
		if err := add(GatewayRed, DenyRedis, withRedis, nil); err != nil {
			return nil, err
		}
	}
	for i := range e.Targets {
		e.Targets[i].redisCPU = o.RedisCPU
	}
	// Order: admitted targets first, then the denial paths.
	order := map[string]int{Direct: 0, BareProxy: 1, GatewayMem: 2, GatewayMemTraced: 3, FedOne: 4, FedThree: 5, StdioDirect: 6, FedStdio: 7, GatewayRed: 8, DenyMem: 9, DenyRedis: 10}
	for i := 1; i < len(e.Targets); i++ {
		for j := i; j > 0 && order[e.Targets[j].Name] < order[e.Targets[j-1].Name]; j-- {
			e.Targets[j], e.Targets[j-1] = e.Targets[j-1], e.Targets[j]
		}
	}
	return e, nil
}

// addBareProxy serves newBareProxy(upstream) and adds it as the bare-proxy
// target.
func (e *Env) addBareProxy(upstream string, tokens []string, log *slog.Logger) error {
	rp, err := newBareProxy(upstream, log)
	if err != nil {
		return err
	}
	e.closers = append(e.closers, rp.Transport.(*http.Transport).CloseIdleConnections)
	u, err := e.server(BareProxy, rp)
	if err != nil {
		return err
	}
	e.Targets = append(e.Targets, Target{Name: BareProxy, URL: u, Tokens: tokens, Status: http.StatusOK})
	return nil
}

// Target returns the target called name, or false.
func (e *Env) Target(name string) (Target, bool) {
	for _, t := range e.Targets {
		if t.Name == name {
			return t, true
		}
	}
	return Target{}, false
}

// Close stops every server, the last started first.
func (e *Env) Close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

func token(secret, tenant, tier string) (string, error) {
	return auth.SignHS256([]byte(secret), map[string]any{
		"tenant_id": tenant, "sub": tenant + "-agent", "tier": tier, "scope": "tools:*",
		"exp": time.Now().Add(24 * time.Hour).Unix(),
	})
}

// builtGateway is a gateway with what it owns.
type builtGateway struct {
	gw      *gateway.Gateway
	metrics *metrics.Metrics
	close   func()
}

// degraded sums mcpgate_degraded_decisions_total over its labels.
func (b *builtGateway) degraded() float64 {
	families, err := b.metrics.Registry.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, f := range families {
		if f.GetName() == "mcpgate_degraded_decisions_total" {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// newGateway wires a gateway from config text as `mcpgate serve` does,
// through package setup: policy.Parse, setup.Auth for the config's auth
// section, the session key derived from the HS256 secret, setup.Open for the
// stores (a SQLite usage store in a temporary directory rather than the
// default file when usage is set, none otherwise; the Redis store and cache
// when store.redis is set), gateway.New (with tp, nil: tracing off).
func newGateway(ctx context.Context, cfgText string, usage bool, log *slog.Logger, tp trace.TracerProvider) (_ *builtGateway, err error) {
	cfg, err := policy.Parse("loadgen.yaml", []byte(cfgText))
	if err != nil {
		return nil, err
	}
	var cleanups []func()
	defer func() {
		if err != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()
	a, err := setup.Auth(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { a.Close() })
	if usage {
		dir, err := os.MkdirTemp("", "loadgen-usage-")
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, func() { os.RemoveAll(dir) })
		cfg.Usage.Store = "sqlite:" + filepath.Join(dir, "usage.db")
	}
	st, err := setup.Open(ctx, cfg, log, &setup.Options{NoUsage: !usage})
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { st.Close() })
	m := metrics.New()
	secret := []byte(os.Getenv(cfg.Auth.JWT.HS256SecretEnv))
	opts := gateway.Options{Config: cfg, Auth: a, Logger: log, Metrics: m, SessionKey: gateway.DeriveSessionKey(secret), TracerProvider: tp,
		SharedStore: st.Shared, Probe: st.Probe, Usage: st.Usage, Cache: st.Cache}
	g, err := gateway.New(context.Background(), opts)
	if err != nil {
		return nil, err
	}
	return &builtGateway{gw: g, metrics: m, close: func() {
		g.Close() // flushes the usage meter before its store closes
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}}, nil
}

// Exhaust spends the one call a day of the exhausted tenant on every
// gateway, so that each deny target answers 429 from its first call, and
// checks that it does.
func (e *Env) Exhaust(ctx context.Context) error {
	for _, t := range e.Targets {
		if t.Status != http.StatusTooManyRequests {
			continue
		}
		c := newClient(1)
		for i := range 2 {
			status, body, err := call(ctx, c, t.URL, t.Tokens[0])
			if err != nil {
				return fmt.Errorf("loadgen: %s: %w", t.Name, err)
			}
			// The first call may find the day's unit unspent (200) or spent
			// by an earlier run on the same Redis (429).
			if i == 1 && status != http.StatusTooManyRequests {
				return fmt.Errorf("loadgen: %s: second call got %d, want 429: %s", t.Name, status, body)
			}
		}
		c.CloseIdleConnections()
	}
	return nil
}

// Check sends one call to every target and checks its status and, for an
// admitted call, that the tool's answer came back.
func (e *Env) Check(ctx context.Context) error {
	for _, t := range e.Targets {
		if t.drive != nil {
			continue // driven otherwise: its driver checks every answer
		}
		c := newClient(1)
		status, body, err := call(ctx, c, t.URL, t.Tokens[0])
		c.CloseIdleConnections()
		if err != nil {
			return fmt.Errorf("loadgen: %s: %w", t.Name, err)
		}
		if status != t.Status {
			return fmt.Errorf("loadgen: %s: status %d, want %d: %s", t.Name, status, t.Status, body)
		}
		want := `"text":"hello"`
		if t.Status == http.StatusTooManyRequests {
			want = `"code":-33029`
		}
		if !strings.Contains(string(body), want) {
			return fmt.Errorf("loadgen: %s: answer lacks %s: %s", t.Name, want, body)
		}
	}
	return nil
}

func call(ctx context.Context, c *http.Client, url, token string) (int, []byte, error) {
	req, err := newRequest(ctx, url, token)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}
