package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/policy"
)

// A reload that switches between upstream.url and upstreams: is refused
// with ErrUpstreamsSwitch, whose text names the field (it used to fail
// deep in the proxy, as `upstream: mcp: upstream URL ""`, or to be taken
// while the upstreams' limits silently went away), and the configuration
// in force stays: calls go on to the same upstream, under the old limits.
func TestReloadSwitchingUpstreamKindIsRefused(t *testing.T) {
	t.Parallel()
	auth := fmt.Sprintf("auth:\n  jwt: {hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET, issuer: %s, audience: %s}\n", testIssuer, testAudience)
	reload := func(t *testing.T, g *Gateway, y string) error {
		t.Helper()
		cfg, err := policy.Parse("reload.yaml", []byte(y+auth))
		if err != nil {
			t.Fatal(err)
		}
		return g.Apply(cfg, authFor(t, cfg, nil))
	}
	refused := func(t *testing.T, err error, startedWith string) {
		t.Helper()
		want := "gateway: upstreams: switching between upstream.url and upstreams needs a restart (this gateway started with " + startedWith + ")"
		if !errors.Is(err, ErrUpstreamsSwitch) || err.Error() != want {
			t.Fatalf("reload: %v, want %q", err, want)
		}
	}

	t.Run("from upstream.url to upstreams", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, setup{})
		before := e.gws[0].Config()
		err := reload(t, e.gws[0], fmt.Sprintf("upstreams:\n  - {name: a, url: %q}\n", e.upURL))
		refused(t, err, "upstream.url")
		if e.gws[0].Config() != before {
			t.Fatal("the configuration in force changed")
		}
		tok := token(t, "acme", "alice")
		cs := connect(t, e.mcpURL(0), tok, "")
		res, err := callTool(t.Context(), cs, "echo", map[string]any{"text": "x"})
		if err != nil || res.IsError {
			t.Fatalf("a call after the refused reload: %v %+v", err, res)
		}
		if reqs := e.requests(); reqs[len(reqs)-1].Header.Get("Authorization") != upstreamCredential {
			t.Errorf("the upstream's credential after the refused reload: %q", reqs[len(reqs)-1].Header.Get("Authorization"))
		}
	})

	t.Run("from upstreams to upstream.url", func(t *testing.T) {
		t.Parallel()
		e := newFedEnv(t, fedSetup{ALimits: "[{name: a_calls, algorithm: fixed_window, limit: 1, period: 1m}]"})
		before := e.gws[0].Config()
		err := reload(t, e.gws[0], "upstream: {url: \"http://127.0.0.1:1/mcp\"}\n")
		refused(t, err, "upstreams")
		if e.gws[0].Config() != before {
			t.Fatal("the configuration in force changed")
		}
		cs := fedConnect(t, e.mcpURL(0), token(t, "acme", "alice"), "", nil)
		wantCall(t, cs, "a__echo", map[string]any{"text": "a"}, "a")
		if _, err := callTool(t.Context(), cs, "a__echo", map[string]any{"text": "again"}); !isRateLimited(err) {
			t.Fatalf("upstream a's limit after the refused reload: second call err = %v, want rate limited", err)
		}
	})
}

// upstreams[].timeout is read at start only (the federation keeps the
// timeout it started with), so a reload keeps it in Config() too, and,
// like store.timeout, warns about it on every reload of a file that
// changes it until a restart: it used to report the file's and warn on
// the first reload only.
func TestReloadUpstreamsStartOnlyInForce(t *testing.T) {
	t.Parallel()
	var logs syncLog
	e := newFedEnv(t, fedSetup{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	start := e.cfg.Upstreams[0].Timeout
	c := *e.cfg
	c.Upstreams = slices.Clone(e.cfg.Upstreams)
	c.Upstreams[0].Timeout = start + time.Minute
	c.Store.Timeout = e.cfg.Store.Timeout + time.Second
	for range 2 {
		if err := e.gws[0].Apply(&c, authFor(t, &c, nil)); err != nil {
			t.Fatal(err)
		}
	}
	out := logs.String()
	store, ups := strings.Count(out, "field=store.timeout"), strings.Count(out, "field=upstreams[].timeout")
	if got := e.gws[0].Config().Upstreams[0].Timeout; got != start {
		t.Errorf("Config().Upstreams[0].Timeout after the reloads: %v, want %v (in force: the federation keeps it)", got, start)
	}
	if ups != store || store != 2 {
		t.Errorf("two reloads of the same file: %d warnings for store.timeout, %d for upstreams[].timeout, want 2 each (neither is applied)", store, ups)
	}
}

// The federation serves the upstreams it started with, and each tool with
// the timeout it started with, whatever a reload says: in Config() a
// reload keeps them so (an upstream the file leaves out still runs, one it
// adds does not, a tool's timeout it adds or changes waits for a restart),
// while each running upstream's limits are the file's, found by name
// whatever the order of the file's list.
func TestReloadKeepsRunningUpstreamsInForce(t *testing.T) {
	t.Parallel()
	var logs syncLog
	e := newFedEnv(t, fedSetup{Config: "tools:\n  a__echo: {timeout: 5s}\n  b__echo: {timeout: 6s}\n",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	stdio := e.cfg.Upstreams[2]
	y := fmt.Sprintf(`upstreams:
  - {name: d, url: %q}
  - {name: c, command: [%q, %q], env: {%s: c}}
  - name: a
    url: %q
    timeout: 1m30s
    limits: [{name: a_calls, algorithm: fixed_window, limit: 1, period: 1m}]
auth:
  jwt: {hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET, issuer: %s, audience: %s}
tools:
  a__echo: {timeout: 9s}
  c__echo: {timeout: 4s}
`, e.b.URL(), stdio.Command[0], stdio.Command[1], fedStdioEnv, e.a.URL(), testIssuer, testAudience)
	cfg, err := policy.Parse("reload.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.gws[0].Apply(cfg, authFor(t, cfg, nil)); err != nil {
		t.Fatal(err)
	}
	got := e.gws[0].Config()
	var names []string
	for _, u := range got.Upstreams {
		names = append(names, u.Name)
	}
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("Config().Upstreams after the reload: %v, want the running a, b, c", names)
	}
	if a, b := got.Upstreams[0], got.Upstreams[1]; a.Timeout != e.cfg.Upstreams[0].Timeout || len(a.Limits) != 1 || len(b.Limits) != 0 || b.URL != e.b.URL() {
		t.Errorf("in force: a %+v, b %+v; want a's timeout of the start with the file's limit, b as it started without limits", a, b)
	}
	want := map[string]time.Duration{"a__echo": 5 * time.Second, "b__echo": 6 * time.Second, "c__echo": 0}
	for name, d := range want {
		if tool, ok := got.Tools[name]; !ok || tool.Timeout != d {
			t.Errorf("Config().Tools[%q] after the reload: %+v (listed %v), want timeout %v", name, tool, ok, d)
		}
	}
	for _, field := range []string{"upstreams[].name", "upstreams[].timeout", "tools.<name>.timeout"} {
		if !strings.Contains(logs.String(), "field="+field) {
			t.Errorf("no restart warning for %s; logs:\n%s", field, logs.String())
		}
	}
	cs := fedConnect(t, e.mcpURL(0), token(t, "acme", "alice"), "", nil)
	wantCall(t, cs, "b__echo", map[string]any{"text": "b"}, "b")
	wantCall(t, cs, "a__echo", map[string]any{"text": "a"}, "a")
	if _, err := callTool(t.Context(), cs, "a__echo", map[string]any{"text": "again"}); !isRateLimited(err) {
		t.Fatalf("upstream a's limit from the reload: second call err = %v, want rate limited", err)
	}
}
