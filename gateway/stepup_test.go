package gateway

import (
	"net/http"
	"testing"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/mcp"
)

// stepUpBodies are requests denied to a "tools:*" caller whose needed scope
// is not simply the kind's prefix and the name: a resource template's
// completion and ambiguous URIs.
var stepUpBodies = []string{
	completionBody(`{"type":"ref/resource","uri":"file:///docs/{name}"}`),
	completionBody(`{"type":"ref/resource","uri":"file:///a*b/{name}"}`),
	completionBody(`{"type":"ref/resource","uri":"file:///docs/../{name}"}`),
	completionBody(`{"type":"ref/resource","uri":"{+path}"}`),
	completionBody(`{"type":"ref/resource","uri":"file:///docs/readme.md"}`),
	resourceReadBody("file:///docs/../etc/passwd"),
	resourceReadBody("file:///docs/a%2Fb"),
	resourceReadBody(`file:///docs\a`),
	subscribeBody(mcp.MethodResourcesSubscribe, "file:///docs/%2e%2e/x"),
	listenBody(`{"resourceSubscriptions":["file:///docs/a","file:///docs/./b"]}`),
	listenBody(`{"resourceSubscriptions":["file:///x/a","file:///y/b","file:///x/a"]}`),
}

// The scope an insufficient_scope 403 names must let the same request
// through once granted: MCP's step-up authorization asks the authorization
// server for exactly that scope and retries, so any other scope loops.
func TestDeniedScopeGrantsTheRequest(t *testing.T) {
	for _, body := range stepUpBodies {
		msg, err := mcp.Parse([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		_, d := authorize(auth.Principal{Tenant: "acme", Scopes: auth.ParseScopes("tools:*")}, msg)
		if d == nil || d.scope == "" {
			t.Fatalf("%s: %+v, want a denial naming a scope", body, d)
		}
		if _, again := authorize(auth.Principal{Tenant: "acme", Scopes: auth.ParseScopes("tools:* " + d.scope)}, msg); again != nil {
			t.Errorf("%s: denial names %q, but a token holding it is denied again: %+v", body, d.scope, again)
		}
	}
}

// On the wire: the client reads the scope from the 403's challenge, gets a
// token with it, and its retry is no longer refused.
func TestStepUpWithChallengeScope(t *testing.T) {
	as := newTestAS(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, Config: oauthConfig(as, "")})
	for _, body := range []string{stepUpBodies[0], stepUpBodies[5]} {
		r := post(t, e.mcpURL(0), sign(t, claims("acme", "alice", "tools:echo")), body, nil)
		if r.Status != http.StatusForbidden {
			t.Fatalf("%s: %d %s", body, r.Status, r.Body)
		}
		scope := challengeParams(t, r.Header.Get("WWW-Authenticate"))["scope"]
		r = post(t, e.mcpURL(0), sign(t, claims("acme", "alice", "tools:echo "+scope)), body, nil)
		if r.Status == http.StatusForbidden {
			t.Errorf("%s: a token with the challenge's scope %q is refused again: %q", body, scope, r.Header.Get("WWW-Authenticate"))
		}
	}
}

// A request the gateway cannot read is a bad request that no scope would
// let through: a 400 (invalid params) without a challenge, not a 403 whose
// step-up could never succeed.
func TestUnreadableRequestIsBadRequest(t *testing.T) {
	bodies := []string{
		completionBody(`{"type":"ref/prompt"}`),
		completionBody(`{"type":"ref/prompt","name":"summarize","NAME":"review"}`),
		listenBody(`{"resourceSubscriptions":"x"}`),
		listenBody(`{"resourceSubscriptions":["file:///docs/a"],"ResourceSubscriptions":["file:///secret/keys.txt"]}`),
	}
	for _, body := range bodies {
		msg, err := mcp.Parse([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		_, d := authorize(auth.Principal{Tenant: "acme", Scopes: auth.ParseScopes("tools:* resources:* prompts:*")}, msg)
		if d == nil || d.invalid == nil || d.invalid.Code != mcp.CodeInvalidParams || d.scope != "" {
			t.Errorf("%s: %+v, want an invalid-params refusal without scope", body, d)
		}
	}
	as := newTestAS(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, Config: oauthConfig(as, "")})
	for _, body := range bodies {
		r := post(t, e.mcpURL(0), sign(t, claims("acme", "alice", "tools:echo")), body, nil)
		if r.Status != http.StatusBadRequest || r.code() != mcp.CodeInvalidParams || r.Header.Values("WWW-Authenticate") != nil {
			t.Errorf("%s: %d %q %s", body, r.Status, r.Header.Values("WWW-Authenticate"), r.Body)
		}
	}
	if e.up.Requests("completion/complete") != 0 || e.up.Requests("subscriptions/listen") != 0 {
		t.Error("a bad request reached the upstream")
	}
}

// A completion ref of another type than ref/prompt and ref/resource is
// scoped like nothing, so it is refused whatever the scopes (as
// gosdk.ScopeMiddleware refuses it): an upstream that folds case would
// otherwise complete "ref/Prompt" for a prompt no scope allows. No scope
// would let it through, so it is a 400 without challenge.
func TestUnknownCompletionRefRefused(t *testing.T) {
	refs := []string{`{"type":"ref/other","name":"review"}`, `{"name":"review"}`, `{"type":"ref/Prompt","name":"review"}`}
	for _, ref := range refs {
		msg, err := mcp.Parse([]byte(completionBody(ref)))
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		for _, sc := range []string{"", "tools:* resources:* prompts:*"} {
			if _, d := authorize(auth.Principal{Tenant: "acme", Scopes: auth.ParseScopes(sc)}, msg); d == nil || d.invalid == nil {
				t.Errorf("ref %s, scopes %q: %+v, want a bad request", ref, sc, d)
			}
		}
	}
	as := newTestAS(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, Config: oauthConfig(as, "")})
	for _, ref := range refs {
		r := post(t, e.mcpURL(0), sign(t, claims("acme", "alice", "")), completionBody(ref), nil)
		if r.Status != http.StatusBadRequest || r.code() != mcp.CodeInvalidParams || r.Header.Values("WWW-Authenticate") != nil {
			t.Errorf("%s: %d %q %s", ref, r.Status, r.Header.Values("WWW-Authenticate"), r.Body)
		}
	}
	if e.up.Requests("completion/complete") != 0 {
		t.Error("a completion of an unknown ref reached the upstream")
	}
}
