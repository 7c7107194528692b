package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// The upstream sees the gateway's identity headers and its own credential,
// never the caller's token, cookie or forged identity headers.
func TestIdentityHeadersNoTokenPassthrough(t *testing.T) {
	t.Parallel()
	forging := func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("X-Mcp-Tenant", "forged-tenant")
			r.Header.Set("X-Mcp-Subject", "forged-subject")
			r.Header.Set("Cookie", "session=caller")
			r.Header.Set("Proxy-Authorization", "Basic Zm9vOmJhcg==")
			return base.RoundTrip(r)
		})
	}
	for _, tc := range []struct {
		name, tenant, sub string
		identity          bool
	}{
		{"plain", "acme", "alice", true},
		{"unicode", "租户-é", "ユーザー", true},
		{"braces", "a}b{c", "x:y", true},
		{"percent", "100%", "s%20", true},
		{"identity headers off", "acme", "alice", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			e := newEnv(t, setup{NoIdentityHeaders: !tc.identity})
			tok := token(t, tc.tenant, tc.sub)
			cs, err := sdkClient().Connect(ctx, transport(e.mcpURL(0), forging(bearer{token: tok})), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := callTool(ctx, cs, "echo", map[string]any{"text": "hi"}); err != nil {
				t.Fatal(err)
			}
			if err := cs.Close(); err != nil {
				t.Fatal(err)
			}
			seen := e.requests()
			methods := map[string]bool{}
			for _, r := range seen {
				methods[r.Method] = true
				if v := r.Header.Values("Authorization"); len(v) != 1 || v[0] != upstreamCredential {
					t.Fatalf("%s reached the upstream with Authorization %q", r.Method, v)
				}
				for _, h := range []string{"Cookie", "Proxy-Authorization"} {
					if v := r.Header.Get(h); v != "" {
						t.Fatalf("%s: %s %q forwarded", r.Method, h, v)
					}
				}
				tenant, subject := r.Header.Values("X-Mcp-Tenant"), r.Header.Values("X-Mcp-Subject")
				if !tc.identity {
					if len(tenant)+len(subject) != 0 {
						t.Fatalf("%s: identity headers off, yet upstream saw tenant %q subject %q", r.Method, tenant, subject)
					}
					continue
				}
				if len(tenant) != 1 || len(subject) != 1 {
					t.Fatalf("%s: X-Mcp-Tenant %q X-Mcp-Subject %q, want one each", r.Method, tenant, subject)
				}
				if got, err := decodeIdentity(tenant[0]); err != nil || got != tc.tenant {
					t.Fatalf("%s: X-Mcp-Tenant %q decodes to %q (%v), want %q", r.Method, tenant[0], got, err, tc.tenant)
				}
				if got, err := decodeIdentity(subject[0]); err != nil || got != tc.sub {
					t.Fatalf("%s: X-Mcp-Subject %q decodes to %q (%v), want %q", r.Method, subject[0], got, err, tc.sub)
				}
			}
			// POST (messages), GET (server stream) and DELETE (session end)
			// all passed through with the same header policy.
			for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
				if !methods[m] {
					t.Errorf("no %s reached the upstream (saw %v)", m, methods)
				}
			}
		})
	}
}

// headerSafe is reversible and never lets two identities share a header
// value, including once HTTP has trimmed the spaces around it.
func TestHeaderSafe(t *testing.T) {
	t.Parallel()
	ids := []string{"acme", "acme ", " acme", "a b", "a+b", "a%20b", "a%2Bb", "100%", "é", "%C3%A9", "é b", "é+b", "", " ", "  ", "+", "%20", "a}b"}
	seen := map[string]string{}
	for _, id := range ids {
		v := headerSafe(id)
		if strings.TrimSpace(v) != v || strings.ContainsAny(v, "\r\n\x00") {
			t.Fatalf("headerSafe(%q) = %q: not a stable header value", id, v)
		}
		for i := 0; i < len(v); i++ {
			if v[i] < 0x20 || v[i] > 0x7e {
				t.Fatalf("headerSafe(%q) = %q: not printable ASCII", id, v)
			}
		}
		if prev, dup := seen[v]; dup {
			t.Fatalf("headerSafe(%q) = headerSafe(%q) = %q", id, prev, v)
		}
		seen[v] = id
		if got, err := decodeIdentity(v); err != nil || got != id {
			t.Fatalf("decode(headerSafe(%q) = %q) = %q, %v", id, v, got, err)
		}
		if strings.Contains(v, "%") {
			if got, err := url.PathUnescape(v); err != nil || got != id {
				t.Fatalf("PathUnescape(%q) = %q, %v; want %q", v, got, err, id)
			}
		}
	}
}

// decodeIdentity reverses headerSafe: values holding '%' were query-escaped.
func decodeIdentity(v string) (string, error) {
	if !strings.Contains(v, "%") {
		return v, nil
	}
	return url.QueryUnescape(v)
}

// Tenant ids built to collide under naive key building each get their own
// counters; the upstream learns each one exactly. (A 5000-byte tenant never
// gets this far: auth refuses tenants over auth.MaxTenantBytes, see
// TestAuthFailuresAre401; 256 bytes is the longest here.)
func TestHostileTenants(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("t", 256) // auth.MaxTenantBytes
	sum := sha256.Sum256([]byte(long))
	tenants := []string{
		"a}b", "a", "b", "a%7Db", "{a}b", "a}",
		"x:y", "x", "y", "x%3Ay", "x:y:z",
		"{", "}", "{}", "%7B", "~", "%7E", "~h" + hex.EncodeToString(sum[:16]),
		"租户", "é", "%C3%A9", "e\u0301", "ACME", "acme", "acme ", " acme",
		long, long[:255] + "u", strings.Repeat("{", 256), strings.Repeat("é", 128),
		"rl:{x}:tenant", "mcpgate:rl:{a}", "*", "?", "[a]", "\\",
		"a b", "a+b", "a%20b", "a%2Bb", "é b", "é+b",
	}
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, `
tools:
  echo:
    limits:
      - {name: one_each, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1h}
  search:
    limits:
      - {name: one_per_tenant, per: tenant, algorithm: fixed_window, limit: 1, period: 1h}
`, upstream.Options{Stateless: true, JSONResponse: true})
			toks := make([]string, len(tenants))
			for i, tn := range tenants {
				toks[i] = token(t, tn, "sub-"+tn)
			}
			for round, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
				for i, tn := range tenants {
					for _, tool := range []string{"echo", "search"} {
						r := e.callRaw(i, toks[i], i, tool, map[string]any{"text": "x", "query": "x"})
						if r.Status != want {
							t.Fatalf("round %d, tenant %q, %s: %d %s, want %d", round, tn, tool, r.Status, r.Body, want)
						}
					}
				}
			}
			if got := e.up.Calls("echo") + e.up.Calls("search"); got != int64(2*len(tenants)) {
				t.Fatalf("upstream saw %d calls, want %d", got, 2*len(tenants))
			}
			seen := map[string]bool{}
			for _, r := range e.requests() {
				v, err := decodeIdentity(r.Header.Get("X-Mcp-Tenant"))
				if err != nil {
					t.Fatal(err)
				}
				seen[v] = true
			}
			for _, tn := range tenants {
				if !seen[tn] {
					t.Errorf("the upstream never saw tenant %q in X-Mcp-Tenant", tn)
				}
			}
			if len(seen) != len(tenants) {
				t.Errorf("the upstream saw %d distinct tenants, want %d", len(seen), len(tenants))
			}
		})
	}
}
