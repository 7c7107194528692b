package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/cli"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

var listening = regexp.MustCompile(`msg="mcpgate listening" addr=(\S+)`)

// testGateway is `mcpgate serve` running in process against a real Redis,
// SQLite usage store and MCP upstream.
type testGateway struct {
	addr   string
	redis  *testenv.Redis
	secret string
}

// startGateway serves a config with a small quota and limit, a cached tool
// and a breaker that opens after two denials, so that a few calls make
// every collector the dashboard and the rules read export a series.
func startGateway(t *testing.T) *testGateway {
	t.Helper()
	rd := testenv.StartRedis(t, nil)
	up := httptest.NewServer(upstream.New(&upstream.Options{Stateless: true, JSONResponse: true}).Handler())
	t.Cleanup(up.Close)
	g := &testGateway{redis: rd, secret: strings.Repeat("k", 32)}
	t.Setenv("DEPLOY_TEST_SECRET", g.secret)
	t.Setenv("DEPLOY_TEST_ADMIN", "admin-token")
	dir := t.TempDir()
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
auth:
  jwt: {hs256_secret_env: DEPLOY_TEST_SECRET}
  admin_token_env: DEPLOY_TEST_ADMIN
store: {redis: %q, on_error: local, timeout: 2s}  # no degraded decision from a slow machine
usage: {store: "sqlite:%s", flush_interval: 100ms}
tiers:
  free:
    monthly_quota: 10
    limits:
      # A bucket of 8 refilling one token in 3h: no window boundary to cross mid-test.
      - {name: per_tenant, per: tenant, algorithm: token_bucket, limit: 8, period: 24h}
tools:
  search: {cache: {ttl: 1m}}
cache: {timeout: 2s}
breaker: {consecutive_denials: 2}
`, up.URL, rd.URL, filepath.Join(dir, "usage.db"))
	path := filepath.Join(dir, "mcpgate.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &testenv.SyncBuffer{}
	done := make(chan int, 1)
	go func() { done <- cli.Main(ctx, []string{"serve", "--config", path}, io.Discard, stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("mcpgate did not stop after its context ended")
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for g.addr == "" {
		if m := listening.FindStringSubmatch(stderr.String()); m != nil {
			g.addr = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("mcpgate exited with %d:\n%s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("mcpgate did not start:\n%s", stderr.String())
		}
	}
	return g
}

// call posts one tools/call as tenant and returns the HTTP status.
func (g *testGateway) call(t *testing.T, tenant, tool, args string) int {
	t.Helper()
	token, err := auth.SignHS256([]byte(g.secret), map[string]any{
		"tenant_id": tenant, "sub": "agent", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix(),
	})
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args)
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// traffic makes acme use 8 of its 10 quota units (80 %: exported), get
// denied twice (a denial, then the breaker opens), and beta call a cached
// tool twice.
func (g *testGateway) traffic(t *testing.T) {
	t.Helper()
	for i := 1; i <= 10; i++ {
		want := http.StatusOK
		if i > 8 {
			want = http.StatusTooManyRequests
		}
		if got := g.call(t, "acme", "echo", `{"text":"hi"}`); got != want {
			t.Fatalf("acme call %d: status %d, want %d", i, got, want)
		}
	}
	for i := range 2 {
		if got := g.call(t, "beta", "search", `{"query":"pricing"}`); got != http.StatusOK {
			t.Fatalf("beta search %d: status %d", i, got)
		}
	}
}

// scrape returns the gateway's /metrics as series name{labels} → value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad metrics line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// metricNames is the set of metric names among series.
func metricNames(series map[string]float64) map[string]bool {
	names := map[string]bool{}
	for s := range series {
		name, _, _ := strings.Cut(s, "{")
		names[name] = true
	}
	return names
}

// queried matches a metric name in PromQL; a name preceded by ':' is part of
// a recording rule's name (tenant:mcpgate_quota_used:ratio), not a metric.
var queried = regexp.MustCompile(`(?:^|[^:\w])(mcpgate_\w+)`)

func namesIn(exprs []string) map[string]bool {
	names := map[string]bool{}
	for _, e := range exprs {
		for _, m := range queried.FindAllStringSubmatch(e, -1) {
			names[m[1]] = true
		}
	}
	return names
}

func dashboardExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("grafana", "mcpgate.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana/mcpgate.json is not valid JSON: %v", err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

func ruleExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("prometheus", "mcpgate-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Expr string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	return exprs
}

// federationOnly are the metrics a gateway serves with upstreams: only
// (this test's gateway has a single upstream); gateway/federation_test.go
// scrapes them from a federated gateway.
var federationOnly = map[string]bool{"mcpgate_upstream_state": true, "mcpgate_upstream_calls_total": true}

// The dashboard and the rules query only metrics the gateway serves; a real
// Prometheus scrapes it; usage flush failures and the store going down show.
func TestGatewayMetrics(t *testing.T) {
	g := startGateway(t)
	g.traffic(t)
	served := scrape(t, g.addr)
	names := metricNames(served)

	for what, exprs := range map[string][]string{"grafana/mcpgate.json": dashboardExprs(t), "prometheus/mcpgate-rules.yml": ruleExprs(t)} {
		wanted := namesIn(exprs)
		if len(wanted) < 5 {
			t.Errorf("%s queries only %v", what, keys(wanted))
		}
		for _, n := range keys(wanted) {
			if !names[n] && !federationOnly[n] {
				t.Errorf("%s queries %s, which the gateway does not serve", what, n)
			}
		}
	}
	if got := served[`mcpgate_tenant_quota_used{tenant="acme"}`]; got != 8 {
		t.Errorf("acme's exported usage = %v, want 8 (8 of 10 units)", got)
	}
	if _, ok := served[`mcpgate_tenant_quota_used{tenant="beta"}`]; ok {
		t.Error("beta (2 of 10 units) is exported: only tenants near their quota must be")
	}

	t.Run("prometheus", func(t *testing.T) {
		want := served[`mcpgate_requests_total{method="tools/call",outcome="admitted"}`]
		if want != 10 {
			t.Fatalf("admitted calls served = %v, want 10", want)
		}
		got := scrapeWithPrometheus(t, g.addr, `sum(mcpgate_requests_total{outcome="admitted"})`)
		if got != want {
			t.Fatalf("Prometheus says %v admitted calls, the gateway %v", got, want)
		}
	})

	t.Run("store down", func(t *testing.T) {
		g.redis.Kill()
		deadline := time.Now().Add(30 * time.Second)
		for {
			// Calls of an admitted tenant go on (on_error: local) and trip
			// the store's breaker; the flusher cannot read the meters.
			g.call(t, "beta", "echo", `{"text":"hi"}`)
			m := scrape(t, g.addr)
			failures := m[`mcpgate_usage_flush_failures_total{op="flush"}`] + m[`mcpgate_usage_flush_failures_total{op="sweep"}`]
			if m["mcpgate_limit_store_up"] == 0 && failures > 0 && m[`mcpgate_degraded_decisions_total{policy="local"}`] > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after Redis died: store_up %v, flush failures %v, degraded %v",
					m["mcpgate_limit_store_up"], failures, m[`mcpgate_degraded_decisions_total{policy="local"}`])
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// requireTool finds a binary of the Debian package prometheus: skipped when
// missing, failed when CI is set.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	testenv.Missing(t, fmt.Sprintf("%s not found: install it with `apt-get install prometheus` (scripts/test does)", name))
	return ""
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrapeWithPrometheus runs a Prometheus server scraping the gateway at
// addr every second, waits until the target is up and query has a result,
// and returns its value.
func scrapeWithPrometheus(t *testing.T, addr, query string) float64 {
	t.Helper()
	bin := requireTool(t, "prometheus")
	dir := t.TempDir()
	conf := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: mcpgate
    static_configs: [{targets: [%q]}]
`, mustAbs(t, filepath.Join("prometheus", "mcpgate-rules.yml")), addr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	web := freePort(t)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+web)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	api := "http://" + web + "/api/v1/"
	deadline := time.Now().Add(60 * time.Second)
	for {
		if targetUp(api) {
			if v, ok := promQuery(api, query); ok {
				return v
			}
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("Prometheus did not scrape the gateway within 60s; its log:\n%s", out)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// getJSON decodes the data of a Prometheus API answer; false on any failure
// (the server may still be starting).
func getJSON(u string, data any) bool {
	resp, err := http.Get(u)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&env) != nil || env.Status != "success" {
		return false
	}
	return json.Unmarshal(env.Data, data) == nil
}

func targetUp(api string) bool {
	var d struct {
		ActiveTargets []struct {
			Health string `json:"health"`
		} `json:"activeTargets"`
	}
	return getJSON(api+"targets?state=active", &d) && len(d.ActiveTargets) == 1 && d.ActiveTargets[0].Health == "up"
}

func promQuery(api, query string) (float64, bool) {
	var d struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if !getJSON(api+"query?query="+url.QueryEscape(query), &d) || len(d.Result) != 1 {
		return 0, false
	}
	s, _ := d.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// The rules are valid and their unit tests (input series, expected alerts)
// pass.
func TestPrometheusRules(t *testing.T) {
	promtool := requireTool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", filepath.Join("prometheus", "mcpgate-rules.yml")},
		{"test", "rules", filepath.Join("prometheus", "mcpgate-rules.test.yml")},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
