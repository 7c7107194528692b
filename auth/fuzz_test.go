package auth

import (
	"context"
	"crypto/elliptic"
	"errors"
	"strings"
	"testing"

	"github.com/lestrrat-go/jwx/v3/jwa"
)

// FuzzVerify feeds arbitrary strings to Verify: it must never panic, every
// refusal must wrap ErrInvalidToken, and an accepted token must carry a
// tenant.
func FuzzVerify(f *testing.F) {
	ec := ecKey(f, elliptic.P256())
	hs := newAuth(f, Options{HS256Secret: testSecret, Now: newClock().Now})
	ks := newAuth(f, Options{JWKSFile: writeFile(f, "jwks.json", jwksJSON(f, []any{&ec.PublicKey}, []string{"k1"}, nil)), Now: newClock().Now})

	good, _ := SignHS256(testSecret, claims(nil))
	f.Add(good)
	f.Add(sign(f, jwa.ES256(), ec, "k1", claims(nil)))
	f.Add(sign(f, jwa.ES256(), ec, "k1", claims(map[string]any{"scope": []any{"tools:*", "x"}, "tier": nil})))
	f.Add(rawToken(f, map[string]any{"alg": "none"}, claims(nil), nil))
	f.Add(rawToken(f, map[string]any{"alg": "HS256", "crit": []string{"x"}}, claims(nil), []byte("sig")))
	f.Add(strings.Replace(good, ".", "..", 1))
	f.Add("eyJhbGciOiJIUzI1NiJ9.e30.")
	f.Add("")
	f.Add("....")

	ctx := context.Background()
	f.Fuzz(func(t *testing.T, tok string) {
		for _, a := range []*Authenticator{hs, ks} {
			p, err := a.Verify(ctx, tok)
			if err != nil {
				if !errors.Is(err, ErrInvalidToken) {
					t.Fatalf("error %v does not wrap ErrInvalidToken", err)
				}
				continue
			}
			if p.Tenant == "" {
				t.Fatalf("accepted token without tenant: %q", tok)
			}
		}
	})
}
