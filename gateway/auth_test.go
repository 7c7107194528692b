package gateway

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// unsigned builds a token with the given header and claims and no valid
// signature.
func unsigned(t *testing.T, header, c map[string]any, sig string) string {
	t.Helper()
	h, _ := json.Marshal(header)
	p, _ := json.Marshal(c)
	enc := base64.RawURLEncoding.EncodeToString
	return enc(h) + "." + enc(p) + "." + sig
}

func without(c map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		delete(c, k)
	}
	return c
}

func with(c map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		c[kv[i].(string)] = kv[i+1]
	}
	return c
}

// Every way a request can fail authentication gets 401 with a Bearer
// challenge and a JSON-RPC error, on POST, GET and DELETE alike, and nothing
// reaches the upstream.
func TestAuthFailuresAre401(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}})
	valid := func() map[string]any { return claims("acme", "alice", "tools:*") }
	now := time.Now()

	other, err := auth.SignHS256([]byte("another-secret-0123456789abcdef-xyz"), valid())
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(valid())
	rs256, err := jws.Sign(payload, jws.WithKey(jwa.RS256(), rsaKey))
	if err != nil {
		t.Fatal(err)
	}
	noneHeader := map[string]any{"alg": "none", "typ": "JWT"}

	cases := []struct {
		name          string
		authorization []string // header values; nil sends none
		invalid       bool     // a token was presented (error="invalid_token")
	}{
		{"no token", nil, false},
		{"basic scheme", []string{"Basic dXNlcjpwYXNz"}, false},
		{"empty bearer", []string{"Bearer "}, true},
		{"garbage", []string{"Bearer garbage"}, true},
		{"three garbage parts", []string{"Bearer a.b.c"}, true},
		{"alg none", []string{"Bearer " + unsigned(t, noneHeader, valid(), "")}, true},
		{"alg none with signature", []string{"Bearer " + unsigned(t, noneHeader, valid(), "c2ln")}, true},
		{"alg NONE", []string{"Bearer " + unsigned(t, map[string]any{"alg": "NONE"}, valid(), "")}, true},
		{"wrong key", []string{"Bearer " + other}, true},
		{"RS256 against an HS256 key", []string{"Bearer " + string(rs256)}, true},
		{"tampered payload", []string{"Bearer " + tamper(t, sign(t, valid()))}, true},
		{"expired", []string{"Bearer " + sign(t, with(valid(), "exp", now.Add(-time.Hour).Unix()))}, true},
		{"no exp (auth.jwt.require_expiry defaults to true)", []string{"Bearer " + sign(t, without(valid(), "exp"))}, true},
		{"not yet valid", []string{"Bearer " + sign(t, with(valid(), "nbf", now.Add(time.Hour).Unix()))}, true},
		{"issued in the future", []string{"Bearer " + sign(t, with(valid(), "iat", now.Add(time.Hour).Unix()))}, true},
		{"wrong issuer", []string{"Bearer " + sign(t, with(valid(), "iss", "https://evil.example"))}, true},
		{"no issuer", []string{"Bearer " + sign(t, without(valid(), "iss"))}, true},
		{"wrong audience", []string{"Bearer " + sign(t, with(valid(), "aud", "someone-else"))}, true},
		{"no audience", []string{"Bearer " + sign(t, without(valid(), "aud"))}, true},
		{"missing tenant claim", []string{"Bearer " + sign(t, without(valid(), "tenant_id"))}, true},
		{"empty tenant claim", []string{"Bearer " + sign(t, with(valid(), "tenant_id", ""))}, true},
		{"numeric tenant claim", []string{"Bearer " + sign(t, with(valid(), "tenant_id", 42))}, true},
		// auth.MaxTenantBytes is 256: a 5000-byte tenant is refused outright.
		{"5000-byte tenant", []string{"Bearer " + sign(t, with(valid(), "tenant_id", strings.Repeat("t", 5000)))}, true},
		{"tenant with a line break", []string{"Bearer " + sign(t, with(valid(), "tenant_id", "a\r\nX-Mcp-Tenant: b"))}, true},
		// Two Authorization headers are a 400 before authentication
		// (mcp.CheckRequestHeaders; see hostile_test.go), not a 401.
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
				var body *strings.Reader
				if method == http.MethodPost {
					body = strings.NewReader(callBody(1, "echo", map[string]any{"text": "x"}))
				} else {
					body = strings.NewReader("")
				}
				req, _ := http.NewRequest(method, e.mcpURL(0), body)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header["Authorization"] = c.authorization
				r, err := do(req)
				if err != nil {
					t.Fatal(err)
				}
				if r.Status != http.StatusUnauthorized {
					t.Fatalf("%s: status %d, want 401: %s", method, r.Status, r.Body)
				}
				ch := r.Header.Get("WWW-Authenticate")
				if !strings.HasPrefix(ch, "Bearer") {
					t.Fatalf("%s: WWW-Authenticate %q, want a Bearer challenge", method, ch)
				}
				if got := strings.Contains(ch, `error="invalid_token"`); got != c.invalid {
					t.Errorf("%s: WWW-Authenticate %q: invalid_token %v, want %v", method, ch, got, c.invalid)
				}
				if r.code() != CodeUnauthorized || r.Msg.JSONRPC != "2.0" {
					t.Fatalf("%s: body %s, want a JSON-RPC error %d", method, r.Body, CodeUnauthorized)
				}
			}
		})
	}
	if n := len(e.requests()); n != 0 {
		t.Fatalf("%d unauthenticated requests reached the upstream", n)
	}

	// The control: the same request with a valid token goes through.
	r := e.callRaw(0, sign(t, valid()), 1, "echo", map[string]any{"text": "x"})
	if r.Status != http.StatusOK || r.Msg.Result == nil {
		t.Fatalf("valid token: %d %s", r.Status, r.Body)
	}
	if e.up.Calls("echo") != 1 {
		t.Fatalf("upstream echo calls %d, want 1", e.up.Calls("echo"))
	}
}

// tamper flips the payload of a signed token to another tenant, keeping the
// signature.
func tamper(t *testing.T, tok string) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	p, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	_ = json.Unmarshal(p, &c)
	c["tenant_id"] = "someone-else"
	p, _ = json.Marshal(c)
	parts[1] = base64.RawURLEncoding.EncodeToString(p)
	return strings.Join(parts, ".")
}

// A tool outside the caller's scopes is refused with 403 and a JSON-RPC
// error carrying the request's id, and never reaches the upstream;
// tools/list shows only the caller's tools, whether the upstream answers in
// JSON or in SSE.
func TestScopes(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		opts upstream.Options
	}{
		{"sse", upstream.Options{}},
		{"json", upstream.Options{JSONResponse: true}},
		{"sse-stateless", upstream.Options{Stateless: true}},
		{"json-stateless", upstream.Options{Stateless: true, JSONResponse: true}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, setup{Upstream: mode.opts})
			limited := sign(t, claims("acme", "alice", "tools:echo tools:search other:scope tools:"))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			names := func(tok string) []string {
				t.Helper()
				cs := connect(t, e.mcpURL(0), tok, "")
				res, err := cs.ListTools(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, tool := range res.Tools {
					out = append(out, tool.Name)
					if tool.InputSchema == nil {
						t.Errorf("tool %s lost its input schema", tool.Name)
					}
				}
				slices.Sort(out)
				return out
			}
			if got := names(limited); !slices.Equal(got, []string{"echo", "search"}) {
				t.Fatalf("scoped tools/list = %v, want [echo search]", got)
			}
			all := slices.Sorted(slices.Values(upstream.ToolNames))
			if got := names(token(t, "acme", "bob")); !slices.Equal(got, all) {
				t.Fatalf("tools:* tools/list = %v, want %v", got, all)
			}
			if got := names(sign(t, claims("acme", "carol", ""))); len(got) != 0 {
				t.Fatalf("no-scope tools/list = %v, want none", got)
			}

			// Calls outside the scopes: 403 with the id, string or number.
			cs := connect(t, e.mcpURL(0), limited, "")
			if _, err := callTool(ctx, cs, "slow", map[string]any{"ms": 1}); err == nil || !strings.Contains(err.Error(), "Forbidden") && !strings.Contains(err.Error(), "scope") {
				t.Fatalf("SDK call outside scopes: %v", err)
			}
			// Raw calls need no session on a stateless upstream (a
			// stateful one: TestForbiddenBeforeSession).
			if mode.opts.Stateless {
				for _, id := range []any{"call-7", 8} {
					r := e.callRaw(0, limited, id, "update_product", map[string]any{"id": "p1"})
					wantID, _ := json.Marshal(id)
					if r.Status != http.StatusForbidden || r.code() != CodeForbidden || string(r.Msg.ID) != string(wantID) {
						t.Fatalf("id %v: %d %s", id, r.Status, r.Body)
					}
				}
			}
			if n := e.up.Calls("slow") + e.up.Calls("update_product"); n != 0 {
				t.Fatalf("%d out-of-scope calls reached the upstream", n)
			}
			// In-scope calls work.
			res, err := callTool(ctx, cs, "echo", map[string]any{"text": "hi"})
			if err != nil || res.IsError {
				t.Fatalf("echo in scope: %v %v", res, err)
			}
		})
	}
}

// Raw 403 for a stateful upstream too: the check runs before the upstream,
// so no session is needed.
func TestForbiddenBeforeSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{})
	tok := sign(t, claims("acme", "alice", "tools:echo"))
	r := e.callRaw(0, tok, "x", "fail", nil)
	if r.Status != http.StatusForbidden || r.code() != CodeForbidden || string(r.Msg.ID) != `"x"` {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	if len(e.requests()) != 0 {
		t.Fatal("a forbidden call reached the upstream")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
