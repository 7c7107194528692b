package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
)

// fakeCatalog is a federation's catalog as checkAttribution reads it: tool
// name to the upstream serving it.
type fakeCatalog map[string]string

func (c fakeCatalog) Tools() []string {
	out := make([]string, 0, len(c))
	for t := range c {
		out = append(out, t)
	}
	return out
}

func (c fakeCatalog) UpstreamOf(tool string) (string, bool) {
	up, ok := c[tool]
	return up, ok
}

// A catalog whose names the configuration reads as another upstream's is
// refused, limits or not (a scope naming that upstream's prefix would
// reach it): at start, and on a reload (checkAttribution runs in Apply).
func TestCheckAttribution(t *testing.T) {
	cfgWith := func(searchLimits string) *policy.Config {
		t.Helper()
		cfg, err := policy.Parse("x.yaml", []byte(`auth: {jwt: {hs256_secret_env: GATEWAY_TEST_SECRET}}
upstreams:
  - name: search
    url: http://127.0.0.1:1/mcp
`+searchLimits+`
  - name: files
    url: http://127.0.0.1:2/mcp
    prefix: ""
`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const limits = `    limits:
      - {name: search_calls, algorithm: fixed_window, limit: 5, period: 1m}`
	sound := fakeCatalog{"search__query": "search", "read": "files"}
	misplaced := fakeCatalog{"search__query": "search", "search__x": "files"} // files' tool reads as search's
	for _, c := range []struct {
		name    string
		cfg     *policy.Config
		catalog fakeCatalog
		refused bool
	}{
		{"sound, limits", cfgWith(limits), sound, false},
		{"misplaced, no limits", cfgWith(""), misplaced, true},
		{"misplaced, limits", cfgWith(limits), misplaced, true},
	} {
		err := checkAttribution(c.cfg, c.catalog)
		if (err != nil) != c.refused || err != nil && !strings.Contains(err.Error(), `"search__x"`) {
			t.Errorf("%s: checkAttribution = %v, want refused %v", c.name, err, c.refused)
		}
	}
}

// A bare upstream (prefix "") that starts listing a tool whose name reads
// as another upstream's (a__x, for upstream a) does not get it exposed,
// though no upstream has limits: a token scoped to a's tools
// (tools:a__*) would see it and call it on the bare upstream.
func TestAttributionKeepsScopesToTheirUpstream(t *testing.T) {
	t.Parallel()
	servers := map[string]*sdk.Server{}
	serve := func(name string, tools ...string) string {
		s := sdk.NewServer(&sdk.Implementation{Name: name, Version: "1"}, nil)
		servers[name] = s
		for _, tool := range tools {
			addServedBy(s, name, tool)
		}
		ts := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
		t.Cleanup(func() {
			ts.CloseClientConnections()
			ts.Close()
			for ss := range s.Sessions() {
				_ = ss.Close()
			}
		})
		return ts.URL + "/mcp"
	}
	y := fmt.Sprintf("upstreams:\n  - {name: a, url: %q}\n  - {name: b, url: %q, prefix: \"\"}\n"+
		"auth:\n  jwt: {hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET, issuer: %s, audience: %s}\n",
		serve("a", "echo"), serve("b", "other"), testIssuer, testAudience)
	cfg, err := policy.Parse("attribution.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	g := (&env{t: t}).newGateway(cfg, setup{Logger: quietLogger()})
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)

	all := fedConnect(t, srv.URL+"/mcp", token(t, "acme", "alice"), "2025-11-25", nil)
	addServedBy(servers["b"], "b", "a__x")
	addServedBy(servers["b"], "b", "later") // listed with a__x, or after it
	testenv.Eventually(t, 10*time.Second, "b's listing with a__x", func() bool {
		return slices.Contains(toolNames(t, all), "later")
	})
	if names := toolNames(t, all); slices.Contains(names, "a__x") {
		t.Fatalf("tools/list = %v: b's a__x, which reads as a's, is exposed", names)
	}
	scoped := fedConnect(t, srv.URL+"/mcp", sign(t, claims("acme", "bob", "tools:a__*")), "2025-11-25", nil)
	names := toolNames(t, scoped)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := callTool(ctx, scoped, "a__x", nil)
	if slices.Contains(names, "a__x") || err == nil && !res.IsError {
		t.Fatalf("with tools:a__* (a's tools): tools/list = %v, and a__x = %+v: a tool of upstream b", names, res)
	}
}

// addServedBy adds to s a tool answering "served by " + upstream.
func addServedBy(s *sdk.Server, upstream, tool string) {
	s.AddTool(&sdk.Tool{Name: tool, InputSchema: map[string]any{"type": "object"}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return textResult("served by " + upstream), nil
	})
}

// The prompt twin of TestAttributionKeepsScopesToTheirUpstream: prompts
// are exposed as <prefix><name> too, and scoped by name (prompts:a__*
// grants upstream a's prompts), so a bare upstream that starts listing a
// prompt a__evil does not get it exposed: a token scoped to a's prompts
// would see it and get it from the bare upstream.
func TestPromptAttributionKeepsScopesToTheirUpstream(t *testing.T) {
	t.Parallel()
	servers := map[string]*sdk.Server{}
	serve := func(name string) string {
		s := sdk.NewServer(&sdk.Implementation{Name: name, Version: "1"}, nil)
		servers[name] = s
		addServedBy(s, name, "echo")
		addPromptServedBy(s, name, "greet")
		ts := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
		t.Cleanup(func() {
			ts.CloseClientConnections()
			ts.Close()
			for ss := range s.Sessions() {
				_ = ss.Close()
			}
		})
		return ts.URL + "/mcp"
	}
	y := fmt.Sprintf("upstreams:\n  - {name: a, url: %q}\n  - {name: b, url: %q, prefix: \"\"}\n"+
		"auth:\n  jwt: {hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET, issuer: %s, audience: %s}\n",
		serve("a"), serve("b"), testIssuer, testAudience)
	cfg, err := policy.Parse("attribution.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	g := (&env{t: t}).newGateway(cfg, setup{Logger: quietLogger()})
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)

	promptNames := func(cs *sdk.ClientSession) []string {
		var names []string
		for p, err := range cs.Prompts(context.Background(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, p.Name)
		}
		return names
	}
	all := fedConnect(t, srv.URL+"/mcp", token(t, "acme", "alice"), "2025-11-25", nil)
	addPromptServedBy(servers["b"], "b", "a__evil")
	addPromptServedBy(servers["b"], "b", "later") // listed with a__evil, or after it
	testenv.Eventually(t, 10*time.Second, "b's listing with a__evil", func() bool {
		return slices.Contains(promptNames(all), "later")
	})
	if names := promptNames(all); slices.Contains(names, "a__evil") || !slices.Contains(names, "a__greet") {
		t.Fatalf("prompts/list = %v: b's a__evil, which reads as a's, is exposed (or a's a__greet is not)", names)
	}
	scoped := fedConnect(t, srv.URL+"/mcp", sign(t, claims("acme", "bob", "prompts:a__*")), "2025-11-25", nil)
	names := promptNames(scoped)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := scoped.GetPrompt(ctx, &sdk.GetPromptParams{Name: "a__evil"})
	if slices.Contains(names, "a__evil") || err == nil {
		got := ""
		if res != nil && len(res.Messages) > 0 {
			got = res.Messages[0].Content.(*sdk.TextContent).Text
		}
		t.Fatalf("with prompts:a__* (a's prompts): prompts/list = %v, and a__evil = %q: a prompt of upstream b", names, got)
	}
}

// addPromptServedBy adds to s a prompt whose message is "served by " +
// upstream.
func addPromptServedBy(s *sdk.Server, upstream, prompt string) {
	s.AddPrompt(&sdk.Prompt{Name: prompt}, func(context.Context, *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: "served by " + upstream}}}}, nil
	})
}
