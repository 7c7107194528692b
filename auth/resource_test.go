package auth

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/lestrrat-go/jwx/v3/jwa"
)

func TestMetadataURL(t *testing.T) {
	cases := []struct{ resource, want string }{
		{"https://gw.example.com/mcp", "https://gw.example.com/.well-known/oauth-protected-resource/mcp"},
		{"https://gw.example.com", "https://gw.example.com/.well-known/oauth-protected-resource"},
		{"https://gw.example.com/", "https://gw.example.com/.well-known/oauth-protected-resource"},
		{"https://gw.example.com:8443/tools/mcp/", "https://gw.example.com:8443/.well-known/oauth-protected-resource/tools/mcp"},
		{"http://127.0.0.1:8080/mcp", "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"},
		{"https://gw.example.com/a%2Fb", "https://gw.example.com/.well-known/oauth-protected-resource/a%2Fb"},
	}
	for _, c := range cases {
		got, err := MetadataURL(c.resource)
		if err != nil || got != c.want {
			t.Errorf("MetadataURL(%q) = %q, %v; want %q", c.resource, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "/mcp", "gw.example.com/mcp", "ftp://gw.example.com/mcp",
		"https://gw.example.com/mcp#x", "https://gw.example.com/mcp#", "https://gw.example.com/mcp?a=b",
		"https://gw.example.com/mcp?", "https://user:pw@gw.example.com/mcp", "https:///mcp"} {
		if got, err := MetadataURL(bad); !errors.Is(err, ErrBadResource) {
			t.Errorf("MetadataURL(%q) = %q, %v; want ErrBadResource", bad, got, err)
		}
	}
}

func TestScopesSupported(t *testing.T) {
	got := ScopesSupported([]string{"search", "fetch", "search", "", "*", "has space", `q"uote`, "ünï"})
	want := []string{"tools:*", "prompts:*", "resources:*", "tools:fetch", "tools:search"}
	if !slices.Equal(got, want) {
		t.Fatalf("ScopesSupported = %q, want %q", got, want)
	}
	// Every advertised scope means what it says to ParseScopes.
	sc := ParseScopes("tools:fetch")
	if !sc.AllowsTool("fetch") || sc.AllowsTool("search") {
		t.Fatalf("tools:fetch parsed as %v", sc)
	}
}

func TestNeededScope(t *testing.T) {
	long := string(make([]byte, maxNeededScope))
	cases := []struct{ kind, name, want string }{
		{"tool", "search", "tools:search"},
		{"prompt", "greet", "prompts:greet"},
		{"resource", "file:///docs/a.md", "resources:file:///docs/a.md"},
		{"tool", "has space", "tools:*"},
		{"tool", `x"y`, "tools:*"},
		{"resource", "file:///ü", "resources:*"},
		{"prompt", "", "prompts:*"},
		{"tool", long, "tools:*"},
		{"other", "x", ""},
		// only "resources:*" allows an ambiguous URI
		{"resource", "file:///docs/../etc/passwd", "resources:*"},
		{"resource", "file:///docs/a%2Fb", "resources:*"},
		{"resource", "file:///a*b", "resources:file:///a*b"},
	}
	for _, c := range cases {
		got := NeededScope(c.kind, c.name)
		if got != c.want {
			t.Errorf("NeededScope(%q, %.20q) = %q, want %q", c.kind, c.name, got, c.want)
		}
		if got != "" {
			sc := ParseScopes(got)
			allowed := map[string]bool{"tool": sc.AllowsTool(c.name), "prompt": sc.AllowsPrompt(c.name), "resource": sc.AllowsResource(c.name)}
			if !allowed[c.kind] {
				t.Errorf("NeededScope(%q, %.20q) = %q does not grant it", c.kind, c.name, got)
			}
		}
	}
}

func TestNeededTemplateScope(t *testing.T) {
	long := "file:///" + string(make([]byte, maxNeededScope)) + "{x}"
	for _, c := range []struct{ tmpl, want string }{
		{"file:///docs/{name}", "resources:file:///docs/*"},
		{"file:///docs/{name}/{page}", "resources:file:///docs/*"},
		{"file:///a*b/{name}", "resources:file:///a*"},
		{"file:///docs/readme.md", "resources:file:///docs/readme.md"},
		{"file:///docs/../{name}", "resources:*"},
		{"file:///docs/%2f{name}", "resources:*"},
		{"{+path}", "resources:*"},
		{"*{x}", "resources:*"},
		{"file:///ü/{name}", "resources:*"},
		{long, "resources:*"},
	} {
		got := NeededTemplateScope(c.tmpl)
		if got != c.want {
			t.Errorf("NeededTemplateScope(%.30q) = %q, want %q", c.tmpl, got, c.want)
		}
		if !ParseScopes(got).AllowsResourceTemplate(c.tmpl) {
			t.Errorf("NeededTemplateScope(%.30q) = %q does not grant it", c.tmpl, got)
		}
	}
}

func TestChallengeString(t *testing.T) {
	cases := []struct {
		c    Challenge
		want string
	}{
		{Challenge{Realm: "mcpgate"}, `Bearer realm="mcpgate"`},
		{Challenge{Realm: "mcpgate", Error: "invalid_token", ResourceMetadata: "https://h/.well-known/oauth-protected-resource/mcp"},
			`Bearer realm="mcpgate", error="invalid_token", resource_metadata="https://h/.well-known/oauth-protected-resource/mcp"`},
		{Challenge{Error: "insufficient_scope", Scope: "tools:x", ResourceMetadata: "https://h/m"},
			`Bearer error="insufficient_scope", scope="tools:x", resource_metadata="https://h/m"`},
		{Challenge{Realm: "a\"b\\c\r\nd"}, `Bearer realm="a\"b\\cd"`},
		{Challenge{}, `Bearer`},
	}
	for _, c := range cases {
		if got := c.c.String(); got != c.want {
			t.Errorf("%+v.String() = %s, want %s", c.c, got, c.want)
		}
	}
}

// With Resource set, a token must be issued for it (RFC 8707): its aud
// must hold the resource, and the configured Audience too when there is one.
func TestResourceAudience(t *testing.T) {
	const res = "https://gw.example.com/mcp"
	onlyResource := hsAuth(t, func(o *Options) { o.Resource = res })
	both := hsAuth(t, func(o *Options) { o.Resource = res; o.Audience = "mcpgate" })
	same := hsAuth(t, func(o *Options) { o.Resource = res; o.Audience = res })
	tok := func(aud any) string { return sign(t, jwa.HS256(), testSecret, "", claims(map[string]any{"aud": aud})) }

	mustVerify(t, onlyResource, tok(res))
	mustVerify(t, onlyResource, tok([]string{"other", res}))
	mustRefuse(t, onlyResource, tok("https://gw.example.com/mcp/"), "wrong audience")
	mustRefuse(t, onlyResource, tok("https://other.example.com/mcp"), "wrong audience")
	mustRefuse(t, onlyResource, sign(t, jwa.HS256(), testSecret, "", claims(nil)), "wrong audience")

	mustVerify(t, both, tok([]string{"mcpgate", res}))
	mustRefuse(t, both, tok(res), "wrong audience")
	mustRefuse(t, both, tok("mcpgate"), "wrong audience")

	mustVerify(t, same, tok(res))

	_, err := New(context.Background(), Options{HS256Secret: testSecret, Resource: "https://gw.example.com/mcp#frag"})
	if !errors.Is(err, ErrBadResource) {
		t.Fatalf("New with a fragment in Resource: %v, want ErrBadResource", err)
	}
}
