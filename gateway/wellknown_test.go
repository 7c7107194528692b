package gateway

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/policy"
)

const wellKnown = "/.well-known/oauth-protected-resource"

// prm is the protected-resource metadata as a client decodes it.
type prm struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name"`
}

// fetchPRM GETs url (with host as the Host header when not empty) and
// decodes a 200's metadata.
func fetchPRM(t *testing.T, url, host string, hdr http.Header) (*response, prm) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	var doc prm
	if r.Status == http.StatusOK {
		if err := json.Unmarshal(r.Body, &doc); err != nil {
			t.Fatalf("metadata %s: %v", r.Body, err)
		}
	}
	return r, doc
}

// Without auth.authorization_servers nothing changes: no metadata, the
// challenges of 401 and 403 as before.
func TestOAuthDiscoveryOff(t *testing.T) {
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}})
	for _, p := range []string{wellKnown, wellKnown + "/mcp"} {
		if r, _ := fetchPRM(t, e.base[0]+p, "", nil); r.Status != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", p, r.Status)
		}
	}
	if r := post(t, e.mcpURL(0), "", callBody(1, "echo", nil), nil); r.Header.Get("WWW-Authenticate") != `Bearer realm="mcpgate"` {
		t.Errorf("401 challenge %q", r.Header.Get("WWW-Authenticate"))
	}
	if r := post(t, e.mcpURL(0), "garbage", callBody(1, "echo", nil), nil); r.Header.Get("WWW-Authenticate") != `Bearer realm="mcpgate", error="invalid_token"` {
		t.Errorf("401 challenge %q", r.Header.Get("WWW-Authenticate"))
	}
	r := post(t, e.mcpURL(0), sign(t, claims("acme", "alice", "tools:echo")), callBody(1, "search", nil), nil)
	if r.Status != http.StatusForbidden || r.Header.Values("WWW-Authenticate") != nil {
		t.Errorf("403: %d, challenge %q", r.Status, r.Header.Values("WWW-Authenticate"))
	}
}

// With authorization servers and no auth.resource, the metadata describes
// the MCP endpoint as the request reached it, at the well-known path, its
// /mcp form and nowhere else; forwarded headers change nothing.
func TestResourceMetadataDerived(t *testing.T) {
	as := newTestAS(t)
	e := newEnv(t, setup{
		Upstream: upstream.Options{Stateless: true},
		Config:   oauthConfig(as, "") + "tools:\n  search: {cost: 2}\n  \"bad name\": {cost: 1}\n",
	})
	base := e.base[0]
	want := prm{
		Resource:               base + "/mcp",
		AuthorizationServers:   []string{as.URL},
		ScopesSupported:        []string{"tools:*", "prompts:*", "resources:*", "tools:search"},
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "mcpgate",
	}
	for _, p := range []string{wellKnown, wellKnown + "/mcp"} {
		r, doc := fetchPRM(t, base+p, "", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET %s = %d %s", p, r.Status, r.Body)
		}
		if !equalPRM(doc, want) {
			t.Errorf("GET %s = %+v, want %+v", p, doc, want)
		}
		h := r.Header
		if h.Get("Content-Type") != "application/json" || h.Get("Access-Control-Allow-Origin") != "*" || h.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s headers %v", p, h)
		}
	}
	for _, p := range []string{wellKnown + "/other", wellKnown + "/mcp/x", wellKnown + "x"} {
		if r, _ := fetchPRM(t, base+p, "", nil); r.Status != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", p, r.Status)
		}
	}
	r, doc := fetchPRM(t, base+wellKnown+"/mcp", "", http.Header{
		"X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"evil.example"}, "Forwarded": {"proto=https;host=evil.example"},
	})
	if r.Status != http.StatusOK || doc.Resource != base+"/mcp" {
		t.Errorf("with forwarded headers: %d, resource %q (forwarded headers must not be trusted)", r.Status, doc.Resource)
	}
	if _, doc = fetchPRM(t, base+wellKnown+"/mcp", "GW.Example.com:8443", nil); doc.Resource != "http://gw.example.com:8443/mcp" {
		t.Errorf("resource for Host GW.Example.com:8443 = %q", doc.Resource)
	}

	req, _ := http.NewRequest(http.MethodOptions, base+wellKnown+"/mcp", nil)
	if r, err := do(req); err != nil || r.Status != http.StatusNoContent || r.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Headers"), "MCP-Protocol-Version") {
		t.Errorf("preflight: %v %+v", err, r)
	}
	req, _ = http.NewRequest(http.MethodPost, base+wellKnown, nil)
	if r, err := do(req); err != nil || r.Status != http.StatusMethodNotAllowed {
		t.Errorf("POST: %v %+v", err, r)
	}
}

func equalPRM(a, b prm) bool {
	return a.Resource == b.Resource && slices.Equal(a.AuthorizationServers, b.AuthorizationServers) &&
		slices.Equal(a.ScopesSupported, b.ScopesSupported) && slices.Equal(a.BearerMethodsSupported, b.BearerMethodsSupported) &&
		a.ResourceName == b.ResourceName
}

// A 401 points at the metadata; a 403 says which scope is missing.
func TestOAuthChallenges(t *testing.T) {
	as := newTestAS(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, Config: oauthConfig(as, "")})
	meta := e.base[0] + wellKnown + "/mcp"

	for _, c := range []struct {
		name, tok string
		want      map[string]string
	}{
		{"no token", "", map[string]string{"realm": "mcpgate", "scope": auth.ChallengeScope, "resource_metadata": meta}},
		{"bad token", "garbage", map[string]string{"realm": "mcpgate", "error": "invalid_token", "scope": auth.ChallengeScope, "resource_metadata": meta}},
		{"expired", sign(t, with(claims("acme", "a", "tools:*"), "exp", 1)), map[string]string{"realm": "mcpgate", "error": "invalid_token", "scope": auth.ChallengeScope, "resource_metadata": meta}},
	} {
		r := post(t, e.mcpURL(0), c.tok, callBody(1, "echo", nil), nil)
		if r.Status != http.StatusUnauthorized || r.code() != CodeUnauthorized {
			t.Fatalf("%s: %d %s", c.name, r.Status, r.Body)
		}
		if got := challengeParams(t, r.Header.Get("WWW-Authenticate")); !equalMaps(got, c.want) {
			t.Errorf("%s: challenge %q, want %v", c.name, r.Header.Get("WWW-Authenticate"), c.want)
		}
	}
	if r := get(t, e.mcpURL(0), ""); r.Status != http.StatusUnauthorized ||
		challengeParams(t, r.Header.Get("WWW-Authenticate"))["resource_metadata"] != meta {
		t.Errorf("GET without token: %d %q", r.Status, r.Header.Get("WWW-Authenticate"))
	}

	narrow := sign(t, claims("acme", "alice", "tools:echo"))
	for _, c := range []struct{ body, scope string }{
		{callBody(1, "search", nil), "tools:search"},
		{callBody(1, "has space", nil), "tools:*"},
		{`{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///docs/a.md"}}`, "resources:file:///docs/a.md"},
		{`{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"greet"}}`, "prompts:greet"},
	} {
		r := post(t, e.mcpURL(0), narrow, c.body, nil)
		if r.Status != http.StatusForbidden || r.code() != CodeForbidden {
			t.Fatalf("%s: %d %s", c.body, r.Status, r.Body)
		}
		want := map[string]string{"realm": "mcpgate", "error": "insufficient_scope", "scope": c.scope, "resource_metadata": meta}
		if got := challengeParams(t, r.Header.Get("WWW-Authenticate")); !equalMaps(got, want) {
			t.Errorf("%s: challenge %q, want %v", c.body, r.Header.Get("WWW-Authenticate"), want)
		}
	}
	if r := post(t, e.mcpURL(0), narrow, callBody(4, "echo", map[string]any{"text": "hi"}), nil); r.Status != http.StatusOK ||
		r.Header.Values("WWW-Authenticate") != nil {
		t.Errorf("allowed call: %d %q", r.Status, r.Header.Values("WWW-Authenticate"))
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// applyOAuth reloads instance 0 of e with the generated config plus auth
// lines (authorization_servers, resource).
func (e *env) applyOAuth(authLines string) *policy.Config {
	e.t.Helper()
	yaml := e.configYAML(setup{Config: authLines})
	cfg, err := policy.Parse("reload.yaml", []byte(yaml))
	if err != nil {
		e.t.Fatalf("config:\n%s\n%v", yaml, err)
	}
	if err := e.gws[0].Apply(cfg, authFor(e.t, cfg, nil)); err != nil {
		e.t.Fatal(err)
	}
	return cfg
}

// With auth.resource set, the metadata names it whatever the request, is
// also served at its own path, and tokens must carry it in aud as well as
// auth.jwt.audience. A reload turns discovery on and off.
func TestResourceConfigured(t *testing.T) {
	as := newTestAS(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}})
	const resource = "https://mcp.example.com/public/mcp"
	e.applyOAuth(oauthConfig(as, "  resource: "+resource+"\n"))
	base := e.base[0]

	for _, p := range []string{wellKnown, wellKnown + "/mcp", wellKnown + "/public/mcp"} {
		r, doc := fetchPRM(t, base+p, "other.example", nil)
		if r.Status != http.StatusOK || doc.Resource != resource || !slices.Equal(doc.AuthorizationServers, []string{as.URL}) {
			t.Errorf("GET %s = %d %+v", p, r.Status, doc)
		}
		if r.Header.Get("Cache-Control") != "max-age=300" {
			t.Errorf("GET %s Cache-Control %q", p, r.Header.Get("Cache-Control"))
		}
	}
	r := post(t, e.mcpURL(0), "", callBody(1, "echo", nil), nil)
	if got := challengeParams(t, r.Header.Get("WWW-Authenticate"))["resource_metadata"]; got != "https://mcp.example.com"+wellKnown+"/public/mcp" {
		t.Errorf("resource_metadata %q", got)
	}

	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, c := range []struct {
		name string
		aud  any
		want int
	}{
		{"audience only", testAudience, http.StatusUnauthorized},
		{"resource only", resource, http.StatusUnauthorized},
		{"resource with a slash", []string{testAudience, resource + "/"}, http.StatusUnauthorized},
		{"both", []string{testAudience, resource}, http.StatusOK},
	} {
		tok := sign(t, with(claims("acme", "alice", "tools:*"), "aud", c.aud))
		if r := post(t, e.mcpURL(0), tok, list, nil); r.Status != c.want {
			t.Errorf("%s: %d, want %d (%s)", c.name, r.Status, c.want, r.Body)
		}
	}

	e.applyOAuth("")
	if r, _ := fetchPRM(t, base+wellKnown+"/mcp", "", nil); r.Status != http.StatusNotFound {
		t.Errorf("after a reload without authorization servers: %d, want 404", r.Status)
	}
	if r := post(t, e.mcpURL(0), "", callBody(1, "echo", nil), nil); r.Header.Get("WWW-Authenticate") != `Bearer realm="mcpgate"` {
		t.Errorf("after a reload without authorization servers: challenge %q", r.Header.Get("WWW-Authenticate"))
	}
}

// A derived resource behind a proxy is wrong, and the gateway cannot know
// the right one: the first request with forwarding headers logs a warning
// (once), and the derivation still ignores those headers.
func TestForwardedHeadersWarnOnce(t *testing.T) {
	as := newTestAS(t)
	logs := &logBuffer{}
	e := newEnv(t, setup{
		Upstream: upstream.Options{Stateless: true},
		Config:   oauthConfig(as, ""),
		Logger:   slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	const msg = "a request came through a proxy (it carries forwarded headers) and auth.resource is not set: " +
		"the OAuth resource and metadata URL are derived from what reached mcpgate, not what the client used; set auth.resource"
	post(t, e.mcpURL(0), "", callBody(1, "echo", nil), nil)
	if n := len(logs.records(t, msg)); n != 0 {
		t.Fatalf("%d warnings without forwarding headers", n)
	}
	fwd := http.Header{"X-Forwarded-Proto": {"https"}}
	for range 3 {
		r := post(t, e.mcpURL(0), "", callBody(1, "echo", nil), fwd)
		if got := challengeParams(t, r.Header.Get("WWW-Authenticate"))["resource_metadata"]; got != e.base[0]+wellKnown+"/mcp" {
			t.Fatalf("resource_metadata %q with X-Forwarded-Proto", got)
		}
	}
	if n := len(logs.records(t, msg)); n != 1 {
		t.Fatalf("%d warnings, want 1", n)
	}
}
