package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/policy"
)

// reloadFedConfig parses the file name of a federation reload test: its
// upstreams: section (upstreams) followed by the tests' auth section.
func reloadFedConfig(t *testing.T, name, upstreams string) *policy.Config {
	t.Helper()
	auth := fmt.Sprintf("auth:\n  jwt: {hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET, issuer: %s, audience: %s}\n", testIssuer, testAudience)
	cfg, err := policy.Parse(name, []byte(upstreams+auth))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A reload is checked against the upstreams in force, not the file's: a
// file that gives the bare upstream a (prefix "") the prefix "a__" and
// limits is good, since the prefix waits for a restart and in force echo
// is still a's. Checked against the file's prefix, echo read as no
// upstream's and the reload was refused.
func TestReloadAttributionAcceptsPrefixPendingRestart(t *testing.T) {
	t.Parallel()
	ua := startFedHTTP(t, upstream.New(&upstream.Options{Name: "upstream-a"}))
	cfg := reloadFedConfig(t, "start.yaml", fmt.Sprintf("upstreams:\n  - {name: a, url: %q, prefix: \"\"}\n", ua.URL()))
	g := (&env{t: t}).newGateway(cfg, setup{})
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)

	next := reloadFedConfig(t, "reload.yaml", fmt.Sprintf(`upstreams:
  - name: a
    url: %q
    prefix: a__
    limits: [{name: a_calls, algorithm: fixed_window, limit: 1, period: 1m}]
`, ua.URL()))
	if err := g.Apply(next, authFor(t, next, nil)); err != nil {
		t.Fatalf("reload refused, though in force a is still bare and echo its tool: %v", err)
	}
	cs := fedConnect(t, srv.URL+"/mcp", token(t, "acme", "alice"), "", nil)
	wantCall(t, cs, "echo", map[string]any{"text": "1"}, "1")
	if _, err := callTool(t.Context(), cs, "echo", map[string]any{"text": "2"}); !isRateLimited(err) {
		t.Fatalf("a's limit a_calls (1/min) after the reload: second echo err = %v, want rate limited", err)
	}
}

// Parse's rule against limits on one of two bare upstreams holds for the
// upstreams in force too: a file giving c (which lists no tool yet for the
// attribution check to read) the prefix "c__" and limits passes Parse,
// but in force a and c are both bare, so c's limits would count none of
// its calls once it lists tools. The reload is refused, the config stays.
func TestReloadRefusesLimitsOnBareUpstreamInForce(t *testing.T) {
	t.Parallel()
	ua := startFedHTTP(t, upstream.New(&upstream.Options{Name: "upstream-a"}))
	// c lists no tools yet (a new server whose tools come later).
	sc := sdk.NewServer(&sdk.Implementation{Name: "upstream-c", Version: "1"}, nil)
	hc := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return sc }, nil))
	t.Cleanup(hc.Close)
	quiet := hc.URL + "/mcp"
	cfg := reloadFedConfig(t, "start.yaml", fmt.Sprintf("upstreams:\n  - {name: a, url: %q, prefix: \"\"}\n  - {name: c, url: %q, prefix: \"\"}\n", ua.URL(), quiet))
	g := (&env{t: t}).newGateway(cfg, setup{})
	before := g.Config()

	next := reloadFedConfig(t, "reload.yaml", fmt.Sprintf(`upstreams:
  - {name: a, url: %q, prefix: ""}
  - name: c
    url: %q
    prefix: c__
    limits: [{name: c_calls, algorithm: fixed_window, limit: 1, period: 1m}]
`, ua.URL(), quiet))
	err := g.Apply(next, authFor(t, next, nil))
	if err == nil {
		t.Fatal("reload accepted: in force a and c are both bare, so c's limits would count none of its calls")
	}
	if !errors.Is(err, ErrBareUpstreamLimits) {
		t.Errorf("reload refused with %v, want ErrBareUpstreamLimits", err)
	}
	if g.Config() != before {
		t.Error("the configuration in force changed")
	}
}
