package gosdk_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcpgate/mcpgate/gosdk"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// RequireBearerToken and the authenticator agree on every token's exp:
// one the authenticator accepts is let through with that expiry (not
// refused as having none), one it refuses is refused.
func TestRequireBearerTokenAgreesOnExp(t *testing.T) {
	cfg, err := policy.Parse("t.yaml", []byte("upstream: {url: http://127.0.0.1:1/mcp}\nauth:\n  jwt:\n    hs256_secret_env: "+testSecretEnv+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := setup.Auth(t.Context(), cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var got time.Time
	h := gosdk.RequireBearerToken(a, cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = sdkauth.TokenInfoFromContext(r.Context()).Expiration
		w.WriteHeader(http.StatusNoContent)
	}))
	hour := time.Now().Add(time.Hour).Unix()
	for name, exp := range map[string]any{
		"seconds":              hour,
		"fraction of a second": float64(hour) + 0.5,
		"2e12 seconds":         2e12,
		"RFC 3339 string":      time.Unix(hour, 0).UTC().Format(time.RFC3339),
		"seconds in a string":  fmt.Sprint(hour),
		"expired a minute ago": time.Now().Add(-time.Minute).Unix(),
	} {
		t.Run(name, func(t *testing.T) {
			c := claims("acme", "alice", "tools:*")
			c["exp"] = exp
			tok := sign(t, c)
			p, verr := a.Verify(t.Context(), tok)
			got = time.Time{}
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			r.Header.Set("Authorization", "Bearer "+tok)
			h.ServeHTTP(rec, r)
			switch {
			case verr != nil && rec.Code != http.StatusUnauthorized:
				t.Fatalf("Verify refused it (%v), RequireBearerToken answered %d", verr, rec.Code)
			case verr == nil && rec.Code != http.StatusNoContent:
				t.Fatalf("Verify accepted it, RequireBearerToken answered %d: %s", rec.Code, rec.Body.String())
			case verr == nil && !got.Equal(p.Expiry):
				t.Fatalf("TokenInfo.Expiration = %v, want the verified exp %v", got, p.Expiry)
			}
		})
	}
}
