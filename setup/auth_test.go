package setup

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/policy"
)

const authTestSecret = "setup-auth-test-secret-0123456789abcdef"

// authFromYAML builds the authenticator Auth builds from a config whose
// auth.jwt section ends with extra, on a fixed clock.
func authFromYAML(t *testing.T, extra string, now time.Time) *auth.Authenticator {
	t.Helper()
	t.Setenv("SETUP_AUTH_TEST_SECRET", authTestSecret)
	yaml := "upstream:\n  url: http://127.0.0.1:1/mcp\nauth:\n  jwt:\n    hs256_secret_env: SETUP_AUTH_TEST_SECRET\n" + extra
	cfg, err := policy.Parse("auth_test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", yaml, err)
	}
	opts, err := AuthOptions(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts.Now = func() time.Time { return now }
	a, err := auth.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func signed(t *testing.T, claims map[string]any) string {
	t.Helper()
	tok, err := auth.SignHS256([]byte(authTestSecret), claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestAuthOptionsExpirySubjectLeeway(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	noExp := signed(t, map[string]any{"tenant_id": "t", "sub": "u"})
	noSub := signed(t, map[string]any{"tenant_id": "t", "exp": now.Add(time.Hour).Unix()})
	// expired 10s ago: inside the default 30s leeway, outside 5s and none
	expired := signed(t, map[string]any{"tenant_id": "t", "sub": "u", "exp": now.Add(-10 * time.Second).Unix()})
	// expired 1s ago: only "no leeway" refuses it (auth's own zero would
	// mean its 30s default)
	justExpired := signed(t, map[string]any{"tenant_id": "t", "sub": "u", "exp": now.Add(-time.Second).Unix()})

	cases := []struct {
		name, yaml, token string
		ok                bool
	}{
		{"no exp, default config", "", noExp, false},
		{"no exp, require_expiry false", "    require_expiry: false\n", noExp, true},
		{"no exp, require_expiry true", "    require_expiry: true\n", noExp, false},
		{"no sub, default config", "", noSub, true},
		{"no sub, require_subject", "    require_subject: true\n", noSub, false},
		{"expired 10s, default leeway", "", expired, true},
		{"expired 10s, leeway 5s", "    leeway: 5s\n", expired, false},
		{"expired 10s, leeway 1m", "    leeway: 1m\n", expired, true},
		{"expired 1s, leeway 0s", "    leeway: 0s\n", justExpired, false},
		{"expired 1s, default leeway", "", justExpired, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := authFromYAML(t, c.yaml, now)
			_, err := a.Verify(context.Background(), c.token)
			if c.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !c.ok && !errors.Is(err, auth.ErrInvalidToken) {
				t.Fatalf("err = %v, want ErrInvalidToken", err)
			}
		})
	}
}

func TestAuthLeeway(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{0: -1, time.Second: time.Second, 30 * time.Second: 30 * time.Second} {
		if got := AuthLeeway(in); got != want {
			t.Errorf("AuthLeeway(%v) = %v, want %v", in, got, want)
		}
	}
}

// Auth fails on a key source it cannot use, and CheckAuth (mcpgate check)
// fails the same, without touching the network: it does not fetch a JWKS
// URL, whose answer only serve can know.
func TestAuthAndCheckAuthErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SETUP_AUTH_TEST_SECRET", authTestSecret)
	var fetched atomic.Int64
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetched.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer idp.Close()
	for _, c := range []struct {
		name, source string
		authErr      string // "" for no error
		checkErr     string
	}{
		{"secret set", "hs256_secret_env: SETUP_AUTH_TEST_SECRET", "", ""},
		{"secret unset", "hs256_secret_env: SETUP_AUTH_TEST_SURELY_UNSET", "auth.jwt.hs256_secret_env: environment variable SETUP_AUTH_TEST_SURELY_UNSET is not set", "auth.jwt.hs256_secret_env: environment variable SETUP_AUTH_TEST_SURELY_UNSET is not set"},
		{"missing PEM file", "public_key_file: " + filepath.Join(dir, "missing.pem"), "auth: reading public key file", "auth: reading public key file"},
		{"PEM file without a key", "public_key_file: " + garbage, "auth: public key file " + garbage + " holds no PEM block", "auth: public key file " + garbage + " holds no PEM block"},
		{"missing JWKS file", "jwks_file: " + filepath.Join(dir, "missing.json"), "auth: reading JWKS file", "auth: reading JWKS file"},
		{"JWKS file not JSON", "jwks_file: " + garbage, "auth: JWKS file " + garbage, "auth: JWKS file " + garbage},
		{"JWKS URL answering 503", "jwks_url: " + idp.URL + "/jwks", "auth: fetching JWKS", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := policy.Parse("auth_test.yaml", []byte("upstream:\n  url: http://127.0.0.1:1/mcp\nauth:\n  jwt:\n    "+c.source+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			before := fetched.Load()
			checkErr := CheckAuth(context.Background(), cfg)
			if fetched.Load() != before {
				t.Error("CheckAuth fetched the JWKS URL")
			}
			a, authErr := Auth(context.Background(), cfg, slog.New(slog.DiscardHandler))
			if authErr == nil {
				_ = a.Close()
			}
			for _, e := range []struct {
				what string
				err  error
				want string
			}{{"Auth", authErr, c.authErr}, {"CheckAuth", checkErr, c.checkErr}} {
				switch {
				case e.want == "" && e.err != nil:
					t.Errorf("%s: %v, want no error", e.what, e.err)
				case e.want != "" && (e.err == nil || !strings.HasPrefix(e.err.Error(), e.want)):
					t.Errorf("%s: %v, want an error starting %q", e.what, e.err, e.want)
				}
			}
		})
	}
}
