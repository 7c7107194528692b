package gateway

// A small, real OAuth 2.1 authorization server for the discovery tests:
// RFC 8414 metadata, an authorization endpoint that approves at once
// (302 to the redirect URI with a code), and a token endpoint that checks
// PKCE (S256) and issues an HS256 JWT the test gateway accepts, with the
// requested resource (RFC 8707) as an audience.

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// testClientID is the client registered in advance with the test server.
const testClientID = "mcpgate-test-client"

// testAS is a running test authorization server.
type testAS struct {
	t   *testing.T
	URL string // its issuer identifier: http://127.0.0.1:port

	mu        sync.Mutex
	codes     map[string]url.Values // code → the authorization request
	authorize []url.Values          // every authorization request, in order
	tokens    []url.Values          // every token request, in order
	metadata  int                   // metadata fetches
}

func newTestAS(t *testing.T) *testAS {
	t.Helper()
	as := &testAS{t: t, codes: map[string]url.Values{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", as.serveMetadata)
	mux.HandleFunc("GET /authorize", as.serveAuthorize)
	mux.HandleFunc("POST /token", as.serveToken)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	as.URL = srv.URL
	return as
}

func (as *testAS) serveMetadata(w http.ResponseWriter, _ *http.Request) {
	as.mu.Lock()
	as.metadata++
	as.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"issuer":                                as.URL,
		"authorization_endpoint":                as.URL + "/authorize",
		"token_endpoint":                        as.URL + "/token",
		"response_types_supported":              []string{"code"},
		"grant_types_supported":                 []string{"authorization_code"},
		"code_challenge_methods_supported":      []string{"S256"},
		"token_endpoint_auth_methods_supported": []string{"none"},
	})
}

// serveAuthorize approves every well-formed request of testClientID.
func (as *testAS) serveAuthorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	as.mu.Lock()
	as.authorize = append(as.authorize, q)
	as.mu.Unlock()
	redirect, err := url.Parse(q.Get("redirect_uri"))
	switch {
	case err != nil || redirect.Scheme == "":
		http.Error(w, "bad redirect_uri", http.StatusBadRequest)
		return
	case q.Get("response_type") != "code", q.Get("client_id") != testClientID,
		q.Get("code_challenge") == "", q.Get("code_challenge_method") != "S256":
		http.Error(w, "bad authorization request", http.StatusBadRequest)
		return
	}
	code := fmt.Sprintf("code-%d", time.Now().UnixNano())
	as.mu.Lock()
	as.codes[code] = q
	as.mu.Unlock()
	rq := redirect.Query()
	rq.Set("code", code)
	rq.Set("state", q.Get("state"))
	redirect.RawQuery = rq.Encode()
	http.Redirect(w, r, redirect.String(), http.StatusFound)
}

// serveToken exchanges a code once, checking PKCE, the redirect URI and
// the resource against the authorization request.
func (as *testAS) serveToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		tokenError(w, "invalid_request")
		return
	}
	f := r.PostForm
	as.mu.Lock()
	as.tokens = append(as.tokens, f)
	req, ok := as.codes[f.Get("code")]
	delete(as.codes, f.Get("code"))
	as.mu.Unlock()
	sum := sha256.Sum256([]byte(f.Get("code_verifier")))
	switch {
	case f.Get("grant_type") != "authorization_code" || !ok:
		tokenError(w, "invalid_grant")
		return
	case base64.RawURLEncoding.EncodeToString(sum[:]) != req.Get("code_challenge"),
		f.Get("redirect_uri") != req.Get("redirect_uri"), f.Get("resource") != req.Get("resource"):
		tokenError(w, "invalid_grant")
		return
	}
	c := claims("acme", "oauth-user", req.Get("scope"))
	if res := req.Get("resource"); res != "" {
		c["aud"] = []string{testAudience, res}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"access_token": sign(as.t, c), "token_type": "Bearer", "expires_in": 3600, "scope": req.Get("scope"),
	})
}

func tokenError(w http.ResponseWriter, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code})
}

// authorizeRequests returns the authorization requests received so far.
func (as *testAS) authorizeRequests() []url.Values {
	as.mu.Lock()
	defer as.mu.Unlock()
	return append([]url.Values(nil), as.authorize...)
}

// tokenRequests returns the token requests received so far.
func (as *testAS) tokenRequests() []url.Values {
	as.mu.Lock()
	defer as.mu.Unlock()
	return append([]url.Values(nil), as.tokens...)
}

// follow sends the authorization request at authURL and returns the code and
// state of the redirect, as the user's browser would deliver them.
func follow(t *testing.T, authURL string) (code, state string) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || err != nil {
		t.Fatalf("authorization request %s: %d, Location %q", authURL, resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc.Query().Get("code"), loc.Query().Get("state")
}

// oauthConfig is the auth lines that turn discovery on (appended to the
// generated auth section), plus extra.
func oauthConfig(as *testAS, extra string) string {
	return fmt.Sprintf("  authorization_servers: [%s]\n", as.URL) + extra
}

// challengeParams parses a Bearer challenge into its parameters (for tests:
// quoted-string values without escapes).
func challengeParams(t *testing.T, h string) map[string]string {
	t.Helper()
	rest, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		t.Fatalf("challenge %q is not Bearer", h)
	}
	out := map[string]string{}
	for part := range strings.SplitSeq(rest, ", ") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
			t.Fatalf("challenge %q: bad parameter %q", h, part)
		}
		out[k] = v[1 : len(v)-1]
	}
	return out
}
