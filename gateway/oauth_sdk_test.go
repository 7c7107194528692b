package gateway

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// The Go SDK's discovery helpers find the metadata from the 401 and the
// authorization server from the metadata; its authorization code handler
// then runs the whole flow against the test authorization server, and the
// token it gets (issued for the resource) is accepted by the gateway, which
// checks the resource in aud.
func TestGoSDKOAuthDiscovery(t *testing.T) {
	as := newTestAS(t)
	e := newEnv(t, setup{Upstream: upstream.Options{}})
	mcpURL := e.mcpURL(0)
	e.applyOAuth(oauthConfig(as, "  resource: "+mcpURL+"\n"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	r := post(t, mcpURL, "", callBody(1, "echo", nil), nil)
	challenges, err := oauthex.ParseWWWAuthenticate(r.Header.Values("WWW-Authenticate"))
	if err != nil || len(challenges) != 1 || challenges[0].Scheme != "bearer" {
		t.Fatalf("challenges %+v: %v", challenges, err)
	}
	metaURL := challenges[0].Params["resource_metadata"]
	if metaURL != e.base[0]+wellKnown+"/mcp" {
		t.Fatalf("resource_metadata %q", metaURL)
	}
	meta, err := oauthex.GetProtectedResourceMetadata(ctx, metaURL, mcpURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(meta.AuthorizationServers) != 1 || meta.AuthorizationServers[0] != as.URL {
		t.Fatalf("authorization servers %q", meta.AuthorizationServers)
	}
	asm, err := sdkauth.GetAuthServerMetadata(ctx, meta.AuthorizationServers[0], nil)
	if err != nil || asm == nil {
		t.Fatalf("authorization server metadata: %+v, %v", asm, err)
	}
	if asm.AuthorizationEndpoint != as.URL+"/authorize" || asm.TokenEndpoint != as.URL+"/token" {
		t.Fatalf("endpoints %q %q", asm.AuthorizationEndpoint, asm.TokenEndpoint)
	}

	handler, err := sdkauth.NewAuthorizationCodeHandler(&sdkauth.AuthorizationCodeHandlerConfig{
		PreregisteredClient: &oauthex.ClientCredentials{ClientID: testClientID},
		RedirectURL:         "http://127.0.0.1:1/callback",
		AuthorizationCodeFetcher: func(_ context.Context, args *sdkauth.AuthorizationArgs) (*sdkauth.AuthorizationResult, error) {
			code, state := follow(t, args.URL)
			return &sdkauth.AuthorizationResult{Code: code, State: state}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := &sdk.StreamableClientTransport{Endpoint: mcpURL, OAuthHandler: handler, MaxRetries: -1, HTTPClient: &http.Client{}}
	cs, err := sdkClient().Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect with the OAuth handler: %v", err)
	}
	defer cs.Close()
	res, err := callTool(ctx, cs, "echo", map[string]any{"text": "through OAuth"})
	if err != nil || res.IsError {
		t.Fatalf("echo: %+v, %v", res, err)
	}

	reqs := as.authorizeRequests()
	if len(reqs) != 1 {
		t.Fatalf("%d authorization requests, want 1", len(reqs))
	}
	q := reqs[0]
	// No scope in the 401: the client asks for scopes_supported (in an
	// order of its own: the SDK does not keep the document's).
	scopes := strings.Fields(q.Get("scope"))
	slices.Sort(scopes)
	if q.Get("resource") != mcpURL || q.Get("client_id") != testClientID || strings.Join(scopes, " ") != "prompts:* resources:* tools:*" {
		t.Errorf("authorization request %v", q)
	}
	if tr := as.tokenRequests(); len(tr) != 1 || tr[0].Get("resource") != mcpURL {
		t.Errorf("token requests %v", tr)
	}
}
