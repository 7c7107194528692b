// Package faults_test puts mcpgate under real-world faults: a Redis Cluster
// losing a master or moving slots under traffic, a fault-injecting TCP proxy
// (toxiproxy) between the gateways and Redis, usage stores that are locked,
// full or gone, and a bounded soak across two gateways. Every server is
// real (internal/testenv); the gateways are built as the mcpgate command
// builds them (policy.Parse, package setup, gateway.New) in front of the demo
// MCP upstream built with the official Go SDK.
//
// The tests run one after another (no t.Parallel): each checks with goleak
// that it leaves no goroutine behind, which needs the package to itself.
package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/gateway"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
	"github.com/mcpgate/mcpgate/usage"
)

const (
	secret   = "faults-test-secret-0123456789abcdef!"
	issuer   = "https://issuer.faults.test"
	audience = "mcpgate-faults"
	admin    = "faults-admin-token"
)

// opts describes one environment.
type opts struct {
	// Config is YAML after the generated upstream and auth sections.
	Config string
	// Instances is the number of gateways (0 means 1); they share the
	// upstream, the Redis of store.redis (each with its own client, as
	// separate processes would) and Usage.
	Instances int
	// Usage is the durable usage store (nil: no metering).
	Usage usage.Store
	// UpstreamYAML is added to the upstream section ("  timeout: 2s\n").
	UpstreamYAML string
}

// env is a running environment.
type env struct {
	t      testing.TB
	up     *upstream.Server
	upSrv  *httptest.Server
	gws    []*gateway.Gateway
	srvs   []*httptest.Server
	stores []*setup.Stores
	client *http.Client
	closed []bool
}

func newEnv(t testing.TB, o opts) *env {
	t.Helper()
	e := &env{t: t, up: upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})}
	e.upSrv = httptest.NewServer(e.up.Handler())
	t.Cleanup(e.upSrv.Close)
	e.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}
	t.Cleanup(e.client.CloseIdleConnections)

	yaml := fmt.Sprintf("upstream:\n  url: %s/mcp\n%sauth:\n  jwt:\n    hs256_secret_env: MCPGATE_FAULTS_UNUSED\n    issuer: %s\n    audience: %s\n%s",
		e.upSrv.URL, o.UpstreamYAML, issuer, audience, o.Config)
	cfg, err := policy.Parse("faults.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", yaml, err)
	}
	for range max(o.Instances, 1) {
		e.addGateway(cfg, o.Usage)
	}
	return e
}

func (e *env) addGateway(cfg *policy.Config, us usage.Store) {
	t := e.t
	t.Helper()
	log := logger()
	a, err := auth.New(context.Background(), auth.Options{
		HS256Secret: []byte(secret), Issuer: issuer, Audience: audience,
		DefaultTier: cfg.DefaultTier, RequireExpiry: true, Leeway: -1, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := setup.Open(ctx, cfg, log, &setup.Options{NoUsage: true})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(context.Background(), gateway.Options{
		Config: cfg, Auth: a, SharedStore: st.Shared, Probe: st.Probe, Usage: us, Cache: st.Cache,
		AdminToken: admin, SessionKey: gateway.DeriveSessionKey([]byte(secret)), Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	i := len(e.gws)
	e.gws = append(e.gws, g)
	e.srvs = append(e.srvs, srv)
	e.stores = append(e.stores, st)
	e.closed = append(e.closed, false)
	t.Cleanup(func() { e.stop(i); _ = a.Close() })
}

// stop shuts instance i down as mcpgate serve does: the server first (calls
// in progress end), then the gateway (its final usage flush), then its stores.
func (e *env) stop(i int) {
	if e.closed[i] {
		return
	}
	e.closed[i] = true
	e.srvs[i].Close()
	if err := e.gws[i].Close(); err != nil {
		e.t.Logf("gateway %d close: %v", i, err)
	}
	_ = e.stores[i].Close()
}

func logger() *slog.Logger {
	if os.Getenv("MCPGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func token(t testing.TB, tenant, sub string) string {
	t.Helper()
	return tieredToken(t, tenant, sub, "")
}

// tieredToken is a token of tenant's subject on tier ("": the default tier).
func tieredToken(t testing.TB, tenant, sub, tier string) string {
	t.Helper()
	now := time.Now()
	c := map[string]any{
		"iss": issuer, "aud": audience, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"tenant_id": tenant, "sub": sub, "scope": "tools:* resources:* prompts:*",
	}
	if tier != "" {
		c["tier"] = tier
	}
	tok, err := auth.SignHS256([]byte(secret), c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// result is one answered call.
type result struct {
	Status  int
	Body    []byte
	Err     error
	Elapsed time.Duration
}

// ok reports a 200 carrying a JSON-RPC result.
func (r result) ok() bool {
	if r.Err != nil || r.Status != http.StatusOK {
		return false
	}
	var m struct {
		Result json.RawMessage `json:"result"`
	}
	return json.Unmarshal(r.Body, &m) == nil && m.Result != nil
}

// call makes one tools/call on instance i with a raw POST, bounded by
// timeout (a hung call comes back with a context error).
func (e *env) call(i int, tok, tool string, args map[string]any, timeout time.Duration) result {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args}})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srvs[i%len(e.srvs)].URL+"/mcp", bytes.NewReader(body))
	if err != nil {
		return result{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Authorization", "Bearer "+tok)
	start := time.Now()
	resp, err := e.client.Do(req)
	if err != nil {
		return result{Err: err, Elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{Status: resp.StatusCode, Body: b, Err: err, Elapsed: time.Since(start)}
}

// get is a GET on instance i's path, with the admin token.
func (e *env) get(i int, path string) (int, string) {
	req, _ := http.NewRequest(http.MethodGet, e.srvs[i].URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.client.Do(req.WithContext(ctx))
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the sum of the samples of metric name (all its label
// sets) on instance i's /metrics.
func (e *env) metric(i int, name string) float64 {
	_, body := e.get(i, "/metrics")
	var sum float64
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		series, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if n, _, _ := strings.Cut(series, "{"); n != name {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			sum += v
		}
	}
	return sum
}

// durable reads tenant's durable usage of period.
func durable(t testing.TB, us usage.Store, tenant, period string) limit.Usage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, _, err := us.Get(ctx, tenant, period)
	if err != nil {
		t.Fatalf("usage of %s: %v", tenant, err)
	}
	return rec.Usage
}

// tally counts answers by kind.
type tally struct {
	mu    sync.Mutex
	kinds map[string]int
	n     atomic.Int64
}

func (c *tally) add(kind string) {
	c.n.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kinds == nil {
		c.kinds = map[string]int{}
	}
	c.kinds[kind]++
}

func (c *tally) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.kinds)
}

// kind classifies an answer: "ok", "429", "503", "hung" (no answer within
// the client's deadline), "err" (transport) or the status.
func kind(r result) string {
	switch {
	case r.Err != nil && (strings.Contains(r.Err.Error(), "deadline") || strings.Contains(r.Err.Error(), "Timeout")):
		return "hung"
	case r.Err != nil:
		return "err"
	case r.ok():
		return "ok"
	}
	return strconv.Itoa(r.Status)
}

// Shared with the other packages' tests (internal/testenv).
var eventually = testenv.Eventually
