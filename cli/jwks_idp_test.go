package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/lestrrat-go/jwx/v3/jwk"
)

// jwksIdP is an identity provider serving the JWK set of one P-256 key
// (kid "k1") on every path; while down is set it answers 503. The test
// closes it.
type jwksIdP struct {
	*httptest.Server
	signer jwk.Key // the private key, kid "k1"
	down   atomic.Bool
}

func newJWKSIdP(t *testing.T) *jwksIdP {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jwk.Import(priv)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := jwk.Import(&priv.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []jwk.Key{signer, pub} {
		if err := k.Set(jwk.KeyIDKey, "k1"); err != nil {
			t.Fatal(err)
		}
	}
	set := jwk.NewSet()
	if err := set.AddKey(pub); err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	idp := &jwksIdP{signer: signer}
	idp.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if idp.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	return idp
}
