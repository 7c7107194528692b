package setup

import (
	"context"
	"errors"
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
