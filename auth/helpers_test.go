package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jws"
)

// t0 is the fake "now" of every test.
var t0 = time.Unix(1_800_000_000, 0)

// testSecret is a valid HS256 secret (32 bytes).
var testSecret = []byte("0123456789abcdef0123456789abcdef")

// clock is a settable clock safe for concurrent use.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(t0.UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// RSA key generation is slow under -race: make the keys once.
var (
	rsaOnce       sync.Once
	rsaKeyA       *rsa.PrivateKey
	rsaKeyB       *rsa.PrivateKey
	rsaKeyWeakErr error
)

func rsaKeys(t testing.TB) (*rsa.PrivateKey, *rsa.PrivateKey) {
	t.Helper()
	rsaOnce.Do(func() {
		var err error
		if rsaKeyA, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			rsaKeyWeakErr = err
			return
		}
		rsaKeyB, rsaKeyWeakErr = rsa.GenerateKey(rand.Reader, 2048)
	})
	if rsaKeyWeakErr != nil {
		t.Fatal(rsaKeyWeakErr)
	}
	return rsaKeyA, rsaKeyB
}

func ecKey(t testing.TB, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func edKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// claims returns a valid claim set at t0; over replaces or (with a nil value)
// deletes claims.
func claims(over map[string]any) map[string]any {
	c := map[string]any{
		"tenant_id": "acme",
		"sub":       "user-1",
		"tier":      "pro",
		"scope":     "openid tools:search tools:fetch",
		"iat":       t0.Unix(),
		"exp":       t0.Add(time.Hour).Unix(),
	}
	for k, v := range over {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return c
}

// sign signs c with key under alg, putting kid in the header when not empty.
func sign(t testing.TB, alg jwa.SignatureAlgorithm, key any, kid string, c map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	hdr := jws.NewHeaders()
	if kid != "" {
		if err := hdr.Set(jws.KeyIDKey, kid); err != nil {
			t.Fatal(err)
		}
	}
	out, err := jws.Sign(payload, jws.WithKey(alg, key, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// rawToken assembles a compact token from a header, claims and signature
// without any library check: the way an attacker builds one.
func rawToken(t testing.TB, hdr map[string]any, c map[string]any, sig []byte) string {
	t.Helper()
	enc := base64.RawURLEncoding
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return enc.EncodeToString(h) + "." + enc.EncodeToString(p) + "." + enc.EncodeToString(sig)
}

// writePEM writes pub as a "PUBLIC KEY" PEM file and returns its path.
func writePEM(t testing.TB, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "key.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func writeFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// jwksJSON encodes public keys as a JWKS; kids[i] names pubs[i] and algs[i],
// when not empty, pins its "alg".
func jwksJSON(t testing.TB, pubs []any, kids []string, algs []string) []byte {
	t.Helper()
	set := jwk.NewSet()
	for i, pub := range pubs {
		k, err := jwk.Import(pub)
		if err != nil {
			t.Fatal(err)
		}
		if err := k.Set(jwk.KeyIDKey, kids[i]); err != nil {
			t.Fatal(err)
		}
		if i < len(algs) && algs[i] != "" {
			if err := k.Set(jwk.AlgorithmKey, algs[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := set.AddKey(k); err != nil {
			t.Fatal(err)
		}
	}
	out, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func newAuth(t testing.TB, opts Options) *Authenticator {
	t.Helper()
	a, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// mustVerify verifies tok and fails the test on error.
func mustVerify(t testing.TB, a *Authenticator, tok string) Principal {
	t.Helper()
	p, err := a.Verify(context.Background(), tok)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return p
}

// mustRefuse verifies tok, expects ErrInvalidToken with a message containing
// want, and returns the error.
func mustRefuse(t testing.TB, a *Authenticator, tok, want string) error {
	t.Helper()
	_, err := a.Verify(context.Background(), tok)
	if err == nil {
		t.Fatalf("Verify accepted a token that should fail with %q", want)
	}
	if !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("error %v does not wrap ErrInvalidToken", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
	return err
}
