package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// nodeProject is the npm project with Node 22 and the TypeScript MCP SDK
// that scripts/test installs for the conformance suite; this test borrows it.
const nodeProject = "../internal/conformance/testdata/node"

// requireNode returns the project's Node binary and the project's absolute
// path. When they are missing the test is skipped with the command that
// installs them, or fails when CI is true: CI never skips.
func requireNode(t *testing.T) (node, project string) {
	t.Helper()
	project, err := filepath.Abs(nodeProject)
	if err == nil {
		node, err = filepath.EvalSymlinks(filepath.Join(project, "node_modules", ".bin", "node"))
	}
	if err == nil {
		_, err = os.Stat(filepath.Join(project, "node_modules", "@modelcontextprotocol", "sdk", "package.json"))
	}
	if err == nil {
		return node, project
	}
	msg := "Node and the TypeScript MCP SDK are not installed (" + err.Error() + "); scripts/test installs them " +
		"(by hand: npm ci --prefix internal/conformance/testdata/node --ignore-scripts && npm rebuild --prefix internal/conformance/testdata/node node)"
	testenv.Missing(t, msg)
	return "", ""
}

// tsDiscovery is what testdata/oauth-discovery.mjs prints.
type tsDiscovery struct {
	Challenge struct {
		ResourceMetadataURL string `json:"resourceMetadataUrl"`
		Scope               string `json:"scope"`
		Error               string `json:"error"`
		Status              int    `json:"status"`
	} `json:"challenge"`
	ResourceMetadata            prm `json:"resourceMetadata"`
	AuthorizationServerMetadata struct {
		Issuer                string `json:"issuer"`
		AuthorizationEndpoint string `json:"authorization_endpoint"`
		TokenEndpoint         string `json:"token_endpoint"`
	} `json:"authorizationServerMetadata"`
	Flow struct {
		FirstConnect     string `json:"firstConnect"`
		AuthorizationURL string `json:"authorizationUrl"`
		DiscoveryState   struct {
			AuthorizationServerURL string `json:"authorizationServerUrl"`
			ResourceMetadata       prm    `json:"resourceMetadata"`
		} `json:"discoveryState"`
		TokenType string   `json:"tokenType"`
		Tools     []string `json:"tools"`
	} `json:"flow"`
	Fetched []struct {
		Method string `json:"method"`
		URL    string `json:"url"`
		Status int    `json:"status"`
	} `json:"fetched"`
}

// The TypeScript SDK's client finds the metadata from the 401's
// resource_metadata, the authorization server from the metadata and its
// endpoints from RFC 8414 metadata, both with its discovery helpers and
// inside Client.connect; the authorization request it builds names the
// resource, and the token it then gets lets it list tools.
func TestTypeScriptSDKOAuthDiscovery(t *testing.T) {
	node, project := requireNode(t)
	as := newTestAS(t)
	e := newEnv(t, setup{Upstream: upstream.Options{}})
	mcpURL := e.mcpURL(0)
	// A listed tool adds tools:echo to scopes_supported, so that the
	// scope the SDK requests tells the challenge's scope from the list's.
	e.applyOAuth(oauthConfig(as, "  resource: "+mcpURL+"\n") + "tools:\n  echo: {}\n")
	metaURL := e.base[0] + wellKnown + "/mcp"

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/oauth-discovery.mjs")
	cmd.Env = append(os.Environ(), "MCP_URL="+mcpURL, "SDK_PROJECT="+project)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var got tsDiscovery
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output %q: %v", stdout.String(), err)
	}
	t.Logf("discovered: %s", stdout.String())

	if c := got.Challenge; c.Status != 401 || c.ResourceMetadataURL != metaURL || c.Error != "" || c.Scope != auth.ChallengeScope {
		t.Errorf("challenge %+v, want resource_metadata %s and scope %q", c, metaURL, auth.ChallengeScope)
	}
	if m := got.ResourceMetadata; m.Resource != mcpURL || !slices.Equal(m.AuthorizationServers, []string{as.URL}) ||
		!slices.Equal(m.BearerMethodsSupported, []string{"header"}) || !slices.Contains(m.ScopesSupported, "tools:*") || !slices.Contains(m.ScopesSupported, "tools:echo") {
		t.Errorf("resource metadata %+v", m)
	}
	if m := got.AuthorizationServerMetadata; m.Issuer != as.URL || m.AuthorizationEndpoint != as.URL+"/authorize" || m.TokenEndpoint != as.URL+"/token" {
		t.Errorf("authorization server metadata %+v", m)
	}

	f := got.Flow
	if f.FirstConnect != "UnauthorizedError" {
		t.Errorf("first connect: %q, want UnauthorizedError", f.FirstConnect)
	}
	if f.DiscoveryState.AuthorizationServerURL != as.URL || f.DiscoveryState.ResourceMetadata.Resource != mcpURL {
		t.Errorf("discovery state %+v", f.DiscoveryState)
	}
	au, err := url.Parse(f.AuthorizationURL)
	if err != nil || !strings.HasPrefix(f.AuthorizationURL, as.URL+"/authorize?") {
		t.Fatalf("authorization URL %q", f.AuthorizationURL)
	}
	q := au.Query()
	if q.Get("resource") != mcpURL || q.Get("client_id") != testClientID || q.Get("code_challenge_method") != "S256" ||
		q.Get("scope") != auth.ChallengeScope {
		t.Errorf("authorization request %v", q)
	}
	if f.TokenType != "Bearer" || !slices.Contains(f.Tools, "echo") {
		t.Errorf("after the flow: token type %q, tools %q", f.TokenType, f.Tools)
	}

	// The SDK fetched the metadata where the 401 pointed, inside connect too.
	var metaFetches int
	for _, x := range got.Fetched {
		if x.URL == metaURL && x.Status == 200 {
			metaFetches++
		}
	}
	if metaFetches < 2 {
		t.Errorf("metadata fetched %d times from %s, want at least 2 (helpers and connect): %+v", metaFetches, metaURL, got.Fetched)
	}
	if tr := as.tokenRequests(); len(tr) != 1 || tr[0].Get("resource") != mcpURL {
		t.Errorf("token requests %v", tr)
	}
}
