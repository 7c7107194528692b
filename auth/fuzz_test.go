package auth

import (
	"context"
	"crypto/elliptic"
	"encoding/base64"
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
			if !canonicalCompact(tok) {
				t.Fatalf("accepted a token not in canonical base64url: %q", tok)
			}
		}
	})
}

// canonicalCompact is checkCompact's oracle: three segments, each what
// base64url gives back for the bytes the strict decoder reads from it (the
// decoder alone would skip line breaks).
func canonicalCompact(tok string) bool {
	segs := strings.Split(tok, ".")
	if len(segs) != 3 {
		return false
	}
	for _, seg := range segs {
		b, err := base64.RawURLEncoding.Strict().DecodeString(seg)
		if err != nil || base64.RawURLEncoding.EncodeToString(b) != seg {
			return false
		}
	}
	return true
}

// FuzzCheckCompact holds checkCompact to its oracle.
func FuzzCheckCompact(f *testing.F) {
	good, _ := SignHS256(testSecret, claims(nil))
	for _, s := range []string{good, good + "=", good + "AA", "..", "a.b.c", "ab.cd.ef", "AB.AQ.Ag", "A.B.C", "Zg.Zh.Zm8", "Zm8=.e30.x", "+/..", "e30\n.e30.e30", "a.b.c.d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		if got, want := checkCompact(tok) == nil, canonicalCompact(tok); got != want {
			t.Fatalf("checkCompact(%q) accepts: %v, oracle: %v", tok, got, want)
		}
	})
}
