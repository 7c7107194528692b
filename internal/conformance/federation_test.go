package conformance

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// federatedRuns is how many times in a row the suite runs through the
// federated gateway (fewer than gatewayRuns: the single-upstream test
// already looks for ordering races in the proxy).
const federatedRuns = 2

// everythingEntry is the stdio entry of @modelcontextprotocol/server-everything
// in the npm project (its bin, dist/index.js, runs stdio by default; the
// "stdio" argument says so).
const everythingEntry = "node_modules/@modelcontextprotocol/server-everything/dist/index.js"

// requireEverything returns the stdio entry of server-everything, skipping
// the test when it is not installed (failing when CI is true: CI never
// skips).
func requireEverything(t *testing.T, s *suite) string {
	t.Helper()
	entry := filepath.Join(s.dir, everythingEntry)
	if _, err := os.Stat(entry); err != nil {
		msg := fmt.Sprintf("conformance: @modelcontextprotocol/server-everything is not installed (%v); %s", err, installHint)
		testenv.Missing(t, msg)
	}
	return entry
}

// suiteToken is the bearer token the suite sends through a gateway.
func suiteToken(t *testing.T) string {
	t.Helper()
	token, err := auth.SignHS256([]byte(secret), map[string]any{"tenant_id": "conformance", "sub": "suite", "scope": "tools:* resources:* prompts:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// The official conformance suite's server scenarios pass through a
// federated gateway (upstreams:) as they pass against the reference server
// directly. The reference server is one of three upstreams, with prefix ""
// (its tools and prompts keep the names the suite calls); next to it are
// the Go SDK demo upstream over HTTP (default prefix "demo__") and
// @modelcontextprotocol/server-everything as a stdio process (prefix
// "everything__"), so that every list the suite reads is a merge and every
// call is routed.
func TestConformanceThroughFederation(t *testing.T) {
	s := requireSuite(t)
	everything := requireEverything(t, s)
	reference, referenceLog := startReference(t, s)
	demo := httptest.NewServer(upstream.New(nil).Handler())
	t.Cleanup(demo.Close)
	gateway, gatewayLog := startGatewayWith(t, fmt.Sprintf(`upstream: {timeout: 5s}
upstreams:
  - {name: reference, url: %q, prefix: ""}
  - {name: demo, url: %q}
  - {name: everything, command: [%q, %q, stdio], prefix: everything__}
`, reference, demo.URL+"/mcp", s.node, everything))
	token := suiteToken(t)

	// The federation is real: the gateway serves the three upstreams' tools
	// under their exposed names, and routes calls to each, for a client of
	// the suite's protocol (2025-11-25, sessions) and one of 2026-07-28
	// (stateless, the Go SDK's default).
	checkFederated(t, gateway+"/mcp", token, "2025-11-25", gatewayLog)
	checkFederated(t, gateway+"/mcp", token, "", gatewayLog)

	compareThroughGateway(t, s, reference, gateway+"/mcp", token, federatedRuns, "the federated gateway", referenceLog, gatewayLog)
}

// checkFederated lists the tools through the gateway with the Go SDK's
// client speaking protocol ("" is the SDK's default, a stateless 2026-07-28
// client) and calls a tool of each upstream (the reference server's with
// no arguments, as the suite calls test_simple_text). It reports what fails
// and goes on.
func checkFederated(t *testing.T, endpoint, token, protocol string, gatewayLog *testenv.SyncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "conformance-federation-check", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint,
		HTTPClient: &http.Client{Transport: bearer(token)}, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect to the federated gateway: %v\ngateway log:\n%s", err, gatewayLog.String())
	}
	defer cs.Close()
	version := cs.InitializeResult().ProtocolVersion
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatalf("protocol %s: tools/list through the federated gateway: %v", version, err)
		}
		names = append(names, tool.Name)
	}
	for _, want := range []string{"test_simple_text", "demo__echo", "everything__echo"} {
		if !slices.Contains(names, want) {
			t.Fatalf("protocol %s: tools/list through the federated gateway: no %s in %q", version, want, names)
		}
	}
	for _, c := range []struct {
		tool string
		args any // nil: no arguments member, as the suite calls test_simple_text
		want string
	}{
		{"demo__echo", map[string]any{"text": "federated"}, "federated"},
		{"everything__echo", map[string]any{"message": "federated"}, "Echo: federated"},
		{"test_simple_text", nil, "This is a simple text response for testing."},
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("protocol %s: call %s through the federated gateway: %v", version, c.tool, err)
			continue
		}
		if got := testenv.ToolText(res); res.IsError || got != c.want {
			t.Errorf("protocol %s: call %s through the federated gateway: %q (isError %t), want %q", version, c.tool, got, res.IsError, c.want)
		}
	}
}

// bearer is an http.RoundTripper adding "Authorization: Bearer <token>".
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
