package gateway

import (
	"errors"
	"fmt"
	"testing"

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
