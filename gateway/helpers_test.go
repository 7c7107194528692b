package gateway

// End-to-end harness: a real MCP upstream (examples/upstream, built with the
// official Go SDK), one or more Gateways built as cli/serve.go builds them
// (policy.Parse, auth.New, redisstore on a real redis-server), served by
// httptest, and clients that are either the SDK's or raw net/http.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	mcpsetup "github.com/mcpgate/mcpgate/setup"
	"github.com/mcpgate/mcpgate/usage"
)

const (
	testSecret   = "gateway-test-secret-0123456789abcdef" // >= 32 bytes
	testIssuer   = "https://issuer.mcpgate.test"
	testAudience = "mcpgate-test"
	testAdmin    = "admin-token-for-tests"
	// upstreamCredential is the gateway's own credential, configured in
	// upstream.headers: the only Authorization the upstream may ever see.
	upstreamCredential = "Bearer upstream-credential"
	redisPlaceholder   = "@@REDIS@@"
)

// setup describes one test environment.
type setup struct {
	// Config is YAML appended to the generated upstream and auth sections:
	// store, tiers, global, tools. "@@REDIS@@" is replaced by Redis's URL.
	Config string
	// Upstream configures the demo upstream (OnRequest is wrapped).
	Upstream upstream.Options
	// Redis, when set, is the shared limit store of every instance.
	Redis *testenv.Redis
	// Instances is how many gateways share the upstream (and Redis); 0 means 1.
	Instances int
	// NoIdentityHeaders turns upstream.identity_headers off.
	NoIdentityHeaders bool
	// MaxBodyBytes is upstream.max_body_bytes; 0 leaves the default.
	MaxBodyBytes int64
	// UpstreamURL, when set, replaces the demo upstream's URL in the config
	// (e.g. a port nothing listens on).
	UpstreamURL string
	// UpstreamYAML is added to the upstream section (lines indented by two
	// spaces, e.g. "  timeout: 1s\n").
	UpstreamYAML string
	// Reload is Options.Reload.
	Reload func(context.Context) error
	// Now is Options.Now.
	Now func() time.Time
	// Usage is Options.Usage of every instance (they share it, as
	// instances share one usage store); nil: no metering.
	Usage usage.Store
	// CacheRedis, when set, gives every instance its own cache.Cache on
	// cache.NewRedisStore over its own client of this server, as
	// cli/serve.go builds one per process for cache.redis. Nil: each
	// instance's in-process cache (unless CacheOptions is set).
	CacheRedis *testenv.Redis
	// WrapStore, when set, wraps each instance's Redis store before it
	// becomes Options.SharedStore (to observe the calls reaching it).
	WrapStore func(*redisstore.Store) limit.GuardedStore
	// CacheOptions, when set, are the options of each instance's cache (on
	// CacheRedis, else on its own memory store); the quiet logger when
	// Logger is nil, a 2s Timeout when Timeout is zero.
	CacheOptions *cache.Options
	// Logger is Options.Logger of every instance; nil means quietLogger().
	Logger *slog.Logger
	// TracerProvider is Options.TracerProvider of every instance.
	TracerProvider trace.TracerProvider
}

// seenRequest is one HTTP request that reached the upstream.
type seenRequest struct {
	Method string
	Header http.Header
}

// env is a running environment.
type env struct {
	t     testing.TB
	up    *upstream.Server
	upURL string // the upstream's MCP endpoint, for direct calls
	gws   []*Gateway
	srvs  []*httptest.Server // the servers of gws, same order
	base  []string           // gateway base URLs (no path)
	cfg   *policy.Config
	redis *testenv.Redis
	mu    sync.Mutex
	seen  []seenRequest
}

// mcpURL is the MCP endpoint of gateway instance i.
func (e *env) mcpURL(i int) string { return e.base[i%len(e.base)] + "/mcp" }

// newEnv starts the upstream and the gateways of s.
func newEnv(t testing.TB, s setup) *env {
	t.Helper()
	e := &env{t: t, redis: s.Redis}
	uo := s.Upstream
	prev := uo.OnRequest
	uo.OnRequest = func(r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, seenRequest{r.Method, r.Header.Clone()})
		e.mu.Unlock()
		if prev != nil {
			prev(r)
		}
	}
	e.up = upstream.New(&uo)
	us := httptest.NewServer(e.up.Handler())
	t.Cleanup(us.Close)
	e.upURL = us.URL + "/mcp"

	yaml := e.configYAML(s)
	cfg, err := policy.Parse("gateway_test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", yaml, err)
	}
	e.cfg = cfg
	n := max(s.Instances, 1)
	for range n {
		g := e.newGateway(cfg, s)
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		e.gws = append(e.gws, g)
		e.srvs = append(e.srvs, srv)
		e.base = append(e.base, srv.URL)
	}
	return e
}

func (e *env) configYAML(s setup) string {
	var b strings.Builder
	upURL := e.upURL
	if s.UpstreamURL != "" {
		upURL = s.UpstreamURL
	}
	fmt.Fprintf(&b, "upstream:\n  url: %s\n  identity_headers: %t\n  headers:\n    Authorization: %q\n",
		upURL, !s.NoIdentityHeaders, upstreamCredential)
	if s.MaxBodyBytes > 0 {
		fmt.Fprintf(&b, "  max_body_bytes: %d\n", s.MaxBodyBytes)
	}
	b.WriteString(s.UpstreamYAML)
	fmt.Fprintf(&b, "auth:\n  jwt:\n    hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET\n    issuer: %s\n    audience: %s\n", testIssuer, testAudience)
	cfg := s.Config
	if s.Redis != nil {
		cfg = strings.ReplaceAll(cfg, redisPlaceholder, s.Redis.URL)
	}
	b.WriteString(cfg)
	return b.String()
}

// authFor maps the auth section to auth.Options as mcpgate serve does
// (setup.AuthOptions), with the test secret in place of the environment
// variable.
func authFor(t testing.TB, cfg *policy.Config, tweak func(*auth.Options)) *auth.Authenticator {
	t.Helper()
	c := *cfg
	c.Auth.JWT.HS256SecretEnv = "" // the secret is set below
	opts, err := mcpsetup.AuthOptions(&c, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	opts.HS256Secret = []byte(testSecret)
	if tweak != nil {
		tweak(&opts)
	}
	a, err := auth.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// newGateway builds one instance as cli/serve.go's newGateway does: its own
// Redis client and redisstore when the config names a Redis.
func (e *env) newGateway(cfg *policy.Config, s setup) *Gateway {
	t := e.t
	t.Helper()
	opts := Options{
		Config:     cfg,
		Auth:       authFor(t, cfg, nil),
		AdminToken: testAdmin,
		Reload:     s.Reload,
		Logger:     cmp.Or(s.Logger, quietLogger()),
		Now:        s.Now,
		SessionKey: DeriveSessionKey([]byte(testSecret)),
		Usage:      s.Usage,

		TracerProvider: s.TracerProvider,
	}
	if s.CacheRedis != nil || s.CacheOptions != nil {
		opts.Cache = newTestCache(t, s.CacheRedis, s.CacheOptions)
	}
	if len(cfg.Store.Redis) > 0 {
		client := newRedisClient(t, cfg.Store.Redis...)
		st, err := redisstore.New(client, &redisstore.Options{Timeout: cfg.Store.Timeout})
		if err != nil {
			t.Fatal(err)
		}
		opts.SharedStore = st
		if s.WrapStore != nil {
			opts.SharedStore = s.WrapStore(st)
		}
		opts.Probe = func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }
	}
	g, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// newTestCache builds a cache as cli/serve.go's buildCache does: on its own
// client of redis, or in process when redis is nil. It is closed when the
// test ends, after the gateway using it (cleanups run in reverse order).
func newTestCache(t testing.TB, redis *testenv.Redis, o *cache.Options) *cache.Cache {
	t.Helper()
	var opts cache.Options
	if o != nil {
		opts = *o
	}
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	if opts.Timeout == 0 {
		// A store operation over the timeout degrades to an uncached load
		// (by design); the default 100ms is within reach of a loaded test
		// machine under -race, which would make hits flaky.
		opts.Timeout = 2 * time.Second
	}
	var store cache.Store
	var err error
	if redis != nil {
		store, err = cache.NewRedisStore(redis.Client(t), nil)
	} else {
		store, err = cache.NewMemoryStore(nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(store, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newRedisClient(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	opt, err := redisstore.ClientOption(addrs...)
	if err != nil {
		t.Fatal(err)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return client
}

// quietLogger drops Info and below; set MCPGATE_TEST_LOG to see everything.
func quietLogger() *slog.Logger {
	if os.Getenv("MCPGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// requests returns the requests that reached the upstream so far.
func (e *env) requests() []seenRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seenRequest(nil), e.seen...)
}

// claims are the defaults of a valid token; each test overrides some.
func claims(tenant, sub, scope string) map[string]any {
	now := time.Now()
	c := map[string]any{
		"iss": testIssuer, "aud": testAudience,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"tenant_id": tenant, "scope": scope,
	}
	if sub != "" {
		c["sub"] = sub
	}
	return c
}

func sign(t testing.TB, c map[string]any) string {
	t.Helper()
	tok, err := auth.SignHS256([]byte(testSecret), c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// token is a valid token for tenant and subject with every tool, resource
// and prompt in scope.
func token(t testing.TB, tenant, sub string) string {
	return sign(t, claims(tenant, sub, "tools:* resources:* prompts:*"))
}

// bearer is an http.RoundTripper adding "Authorization: Bearer <token>", as
// an agent's MCP client does.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	base := b.base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// connect opens an SDK client session to endpoint with tok; protocol ""
// means the SDK's default negotiation.
func connect(t *testing.T, endpoint, tok, protocol string) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := sdkClient().Connect(ctx, transport(endpoint, bearer{token: tok}),
		&sdk.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect to %s: %v", endpoint, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func sdkClient() *sdk.Client {
	return sdk.NewClient(&sdk.Implementation{Name: "gateway-test", Version: "1"}, nil)
}

// transport is the SDK's Streamable HTTP client transport over rt, without
// retries (a retried POST would blur exact counts).
func transport(endpoint string, rt http.RoundTripper) *sdk.StreamableClientTransport {
	return &sdk.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: rt}, MaxRetries: -1}
}

// callTool is an SDK tools/call; it returns the result or the error.
func callTool(ctx context.Context, cs *sdk.ClientSession, tool string, args map[string]any) (*sdk.CallToolResult, error) {
	return cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
}

// isRateLimited reports whether an SDK call error is the gateway's 429.
func isRateLimited(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Too Many Requests")
}

// response is a raw HTTP answer with its JSON-RPC message decoded (from a
// JSON body, or from the first SSE event that is a response).
type response struct {
	Status int
	Header http.Header
	Body   []byte
	Msg    rpcMessage
}

type rpcMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// denied is the data of a 429's JSON-RPC error.
type denied struct {
	Scope             string `json:"scope"`
	Rule              string `json:"rule"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
}

func (r *response) code() int {
	if r.Msg.Error == nil {
		return 0
	}
	return r.Msg.Error.Code
}

func (r *response) denial(t *testing.T) denied {
	t.Helper()
	if r.Msg.Error == nil {
		t.Fatalf("no JSON-RPC error in %d %s", r.Status, r.Body)
	}
	var d denied
	if err := json.Unmarshal(r.Msg.Error.Data, &d); err != nil {
		t.Fatalf("error data %s: %v", r.Msg.Error.Data, err)
	}
	return d
}

// post sends one raw POST to url. The headers a Streamable HTTP client sends
// are set unless hdr overrides them; tok "" sends no Authorization.
func post(t testing.TB, url, tok, body string, hdr http.Header) *response {
	t.Helper()
	resp, err := postCtx(context.Background(), url, tok, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func postCtx(ctx context.Context, url, tok, body string, hdr http.Header) (*response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return do(req)
}

func do(req *http.Request) (*response, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	r := &response{Status: resp.StatusCode, Header: resp.Header, Body: body}
	data := body
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data = nil
		for _, ev := range parseEvents(body) {
			var m rpcMessage
			if json.Unmarshal([]byte(ev.data), &m) == nil && (m.Result != nil || m.Error != nil) {
				data = []byte(ev.data)
				break
			}
		}
	}
	if len(data) > 0 {
		_ = json.Unmarshal(data, &r.Msg)
	}
	return r, nil
}

// get sends a GET with an optional bearer token.
func get(t *testing.T, url, tok string) *response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// callBody is a tools/call request body; id is written as JSON (a Go string
// becomes a JSON string).
func callBody(id any, tool string, args map[string]any) string {
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args},
	})
	return string(b)
}

// callRaw makes one tools/call with a raw POST.
func (e *env) callRaw(instance int, tok string, id any, tool string, args map[string]any) *response {
	e.t.Helper()
	return post(e.t, e.mcpURL(instance), tok, callBody(id, tool, args), nil)
}

// sseEvent is one server-sent event.
type sseEvent struct {
	raw  string // the event's lines, as sent
	data string
}

// parseEvents splits an event stream into events.
func parseEvents(b []byte) []sseEvent {
	var out []sseEvent
	var cur sseEvent
	var data []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if cur.raw != "" {
				cur.data = strings.Join(data, "\n")
				out = append(out, cur)
			}
			cur, data = sseEvent{}, nil
			continue
		}
		cur.raw += line + "\n"
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(v, " "))
		}
	}
	if cur.raw != "" {
		cur.data = strings.Join(data, "\n")
		out = append(out, cur)
	}
	return out
}

// redisCommandCalls reads INFO commandstats and returns the calls of cmd
// (e.g. "evalsha").
func redisCommandCalls(t *testing.T, c rueidis.Client, cmd string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^cmdstat_` + regexp.QuoteMeta(cmd) + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// scriptCalls is how many limit scripts Redis has run: FCALL of the
// mcpgate library, or EVALSHA (plus EVAL after a NOSCRIPT) where functions
// are missing.
func scriptCalls(t *testing.T, c rueidis.Client) int64 {
	return redisCommandCalls(t, c, "fcall") + redisCommandCalls(t, c, "evalsha") + redisCommandCalls(t, c, "eval")
}

// intHeader parses a header that must be an integer.
func intHeader(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v := h.Get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("header %s = %q: not an integer", name, v)
	}
	return n
}

// scrape reads base/metrics and returns every sample by its series as the
// exposition prints it, e.g. `mcpgate_requests_total{method="tools/call",outcome="denied"}`.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	r := get(t, base+"/metrics", "")
	if r.Status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", r.Status, r.Body)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(r.Body)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// Shared with the other packages' tests (internal/testenv).
var (
	eventually = testenv.Eventually
	run        = testenv.Run
)

// peekRPC returns the method and id of the JSON-RPC message in a test
// upstream's request r ("" and nil for a GET, a DELETE or a body that is
// not one), leaving r's body to be read again.
func peekRPC(r *http.Request) (method string, id json.RawMessage) {
	if r.Body == nil {
		return "", nil
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	_ = json.Unmarshal(body, &msg)
	return msg.Method, msg.ID
}
