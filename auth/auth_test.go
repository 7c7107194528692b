package auth

import (
	"context"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/lestrrat-go/jwx/v3/jwa"
)

func hsAuth(t testing.TB, mod func(*Options)) *Authenticator {
	t.Helper()
	opts := Options{HS256Secret: testSecret, DefaultTier: "free", Now: newClock().Now}
	if mod != nil {
		mod(&opts)
	}
	return newAuth(t, opts)
}

func TestHS256(t *testing.T) {
	a := hsAuth(t, nil)
	tok, err := SignHS256(testSecret, claims(nil))
	if err != nil {
		t.Fatal(err)
	}
	p := mustVerify(t, a, tok)
	if p.Tenant != "acme" || p.Subject != "user-1" || p.Tier != "pro" {
		t.Fatalf("principal = %+v", p)
	}
	if !p.Scopes.AllowsTool("search") || !p.Scopes.AllowsTool("fetch") || p.Scopes.AllowsTool("delete") {
		t.Fatalf("scopes = %v", p.Scopes)
	}
}

func TestPublicKeyFile(t *testing.T) {
	rsaA, _ := rsaKeys(t)
	p384 := ecKey(t, elliptic.P384())
	ed := edKey(t)
	cases := []struct {
		name string
		pub  any
		priv any
		alg  jwa.SignatureAlgorithm
	}{
		{"RS256", &rsaA.PublicKey, rsaA, jwa.RS256()},
		{"RS512", &rsaA.PublicKey, rsaA, jwa.RS512()},
		{"PS256", &rsaA.PublicKey, rsaA, jwa.PS256()},
		{"ES256", nil, nil, jwa.ES256()}, // key made below: P-256
		{"ES384", &p384.PublicKey, p384, jwa.ES384()},
		{"EdDSA", ed.Public(), ed, jwa.EdDSA()},
		{"Ed25519", ed.Public(), ed, jwa.EdDSAEd25519()},
	}
	p256 := ecKey(t, elliptic.P256())
	cases[3].pub, cases[3].priv = &p256.PublicKey, p256
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newAuth(t, Options{PublicKeyFile: writePEM(t, c.pub), Now: newClock().Now})
			// The kid of a token is ignored with a PEM key.
			p := mustVerify(t, a, sign(t, c.alg, c.priv, "whatever", claims(nil)))
			if p.Tenant != "acme" {
				t.Fatalf("principal = %+v", p)
			}
		})
	}

	t.Run("ES256 key refuses ES384", func(t *testing.T) {
		a := newAuth(t, Options{PublicKeyFile: writePEM(t, &p256.PublicKey), Now: newClock().Now})
		mustRefuse(t, a, sign(t, jwa.ES384(), p384, "", claims(nil)), `alg "ES384" is not accepted`)
	})
	t.Run("RSA PUBLIC KEY and CERTIFICATE blocks", func(t *testing.T) {
		pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&rsaA.PublicKey)})
		a := newAuth(t, Options{PublicKeyFile: writeFile(t, "k.pem", pkcs1), Now: newClock().Now})
		mustVerify(t, a, sign(t, jwa.RS256(), rsaA, "", claims(nil)))

		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idp"},
			NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p256.PublicKey, p256)
		if err != nil {
			t.Fatal(err)
		}
		cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		a = newAuth(t, Options{PublicKeyFile: writeFile(t, "c.pem", cert), Now: newClock().Now})
		mustVerify(t, a, sign(t, jwa.ES256(), p256, "", claims(nil)))
	})
	t.Run("two keys in one file", func(t *testing.T) {
		_, rsaB := rsaKeys(t)
		var data []byte
		for _, pub := range []any{&rsaA.PublicKey, &rsaB.PublicKey} {
			der, _ := x509.MarshalPKIXPublicKey(pub)
			data = append(data, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
		}
		a := newAuth(t, Options{PublicKeyFile: writeFile(t, "two.pem", data), Now: newClock().Now})
		mustVerify(t, a, sign(t, jwa.RS256(), rsaA, "", claims(nil)))
		mustVerify(t, a, sign(t, jwa.RS256(), rsaB, "", claims(nil)))
	})
}

func TestPublicKeyFileRefused(t *testing.T) {
	p256 := ecKey(t, elliptic.P256())
	privDER, err := x509.MarshalPKCS8PrivateKey(p256)
	if err != nil {
		t.Fatal(err)
	}
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	weakDER, _ := x509.MarshalPKIXPublicKey(&weak.PublicKey)
	p224 := ecKey(t, elliptic.P224())
	for name, c := range map[string]struct {
		data []byte
		want string
	}{
		"private key": {pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), "a private key"},
		"weak RSA":    {pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: weakDER}), "1024 bits"},
		"no PEM":      {[]byte("not a key"), "no PEM block"},
		"bad DER":     {pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}}), "PEM block 1"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(context.Background(), Options{PublicKeyFile: writeFile(t, "k.pem", c.data)})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New error = %v, want %q", err, c.want)
			}
		})
	}
	t.Run("P-224", func(t *testing.T) {
		der, err := x509.MarshalPKIXPublicKey(&p224.PublicKey)
		if err != nil {
			t.Fatal(err) // crypto/x509 marshals P-224 keys: only a test bug gets here
		}
		_, err = New(context.Background(), Options{PublicKeyFile: writeFile(t, "k.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))})
		if err == nil || !strings.Contains(err.Error(), "curve") {
			t.Fatalf("New error = %v, want unsupported curve", err)
		}
	})
}

func TestClaims(t *testing.T) {
	a := hsAuth(t, func(o *Options) { o.Issuer = "https://idp.example"; o.Audience = "mcpgate" })
	ok := func(over map[string]any) map[string]any {
		base := map[string]any{"iss": "https://idp.example", "aud": []string{"other", "mcpgate"}}
		for k, v := range over {
			base[k] = v
		}
		return claims(base)
	}
	hs := func(c map[string]any) string {
		tok, err := SignHS256(testSecret, c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	mustVerify(t, a, hs(ok(nil)))

	refused := map[string]struct {
		claims map[string]any
		want   string
	}{
		"expired":                 {ok(map[string]any{"exp": t0.Add(-time.Minute).Unix()}), "expired"},
		"not yet valid":           {ok(map[string]any{"nbf": t0.Add(time.Minute).Unix()}), "not yet valid"},
		"issued in the future":    {ok(map[string]any{"iat": t0.Add(time.Minute).Unix()}), "issued in the future"},
		"wrong issuer":            {ok(map[string]any{"iss": "https://evil.example"}), "wrong issuer"},
		"missing issuer":          {ok(map[string]any{"iss": nil}), "wrong issuer"},
		"wrong audience":          {ok(map[string]any{"aud": "someone-else"}), "wrong audience"},
		"missing audience":        {ok(map[string]any{"aud": nil}), "wrong audience"},
		"missing tenant":          {ok(map[string]any{"tenant_id": nil}), `missing tenant claim "tenant_id"`},
		"empty tenant":            {ok(map[string]any{"tenant_id": ""}), "missing tenant claim"},
		"numeric tenant":          {ok(map[string]any{"tenant_id": 42}), "is a number, want a string"},
		"tenant too long":         {ok(map[string]any{"tenant_id": strings.Repeat("t", MaxTenantBytes+1)}), "more than 256"},
		"tenant control char":     {ok(map[string]any{"tenant_id": "a\r\nX-Evil: 1"}), "control character"},
		"numeric sub":             {ok(map[string]any{"sub": 7}), "sub"},
		"sub too long":            {ok(map[string]any{"sub": strings.Repeat("s", MaxSubjectBytes+1)}), "more than 1024"},
		"numeric tier":            {ok(map[string]any{"tier": 1}), `tier claim "tier": is a number`},
		"numeric scope":           {ok(map[string]any{"scope": 3}), `scope claim "scope"`},
		"scope array with number": {ok(map[string]any{"scope": []any{"tools:a", 1}}), "want strings"},
		"string exp":              {ok(map[string]any{"exp": "tomorrow"}), "bad claims"},
		// RFC 7519: a NumericDate is a JSON number; the jwt library would
		// read these strings.
		"exp a time.Time (RFC 3339)": {ok(map[string]any{"exp": t0.Add(time.Hour)}), "exp is a string, want a number"},
		"exp digits in a string":     {ok(map[string]any{"exp": fmt.Sprint(t0.Add(time.Hour).Unix())}), "exp is a string, want a number"},
		"nbf digits in a string":     {ok(map[string]any{"nbf": fmt.Sprint(t0.Unix())}), "nbf is a string, want a number"},
		"iat digits in a string":     {ok(map[string]any{"iat": fmt.Sprint(t0.Unix())}), "iat is a string, want a number"},
	}
	for name, c := range refused {
		t.Run(name, func(t *testing.T) { mustRefuse(t, a, hs(c.claims), c.want) })
	}

	t.Run("tenant invalid UTF-8", func(t *testing.T) {
		// json.Marshal would replace the byte, so write the payload by hand.
		payload := []byte(`{"tenant_id":"a` + "\xff" + `b","exp":` + fmt.Sprint(t0.Add(time.Hour).Unix()) + `}`)
		// The JSON decoder may already replace it with U+FFFD; either way no
		// invalid UTF-8 may come out as a tenant.
		p, err := hsAuth(t, nil).Verify(context.Background(), signRaw(t, testSecret, `{"alg":"HS256"}`, payload))
		if err == nil && !utf8.ValidString(p.Tenant) {
			t.Fatalf("tenant %q is not valid UTF-8", p.Tenant)
		}
	})
	t.Run("leeway", func(t *testing.T) {
		// Default leeway is 30s: 10s late passes, 40s late does not.
		mustVerify(t, a, hs(ok(map[string]any{"exp": t0.Add(-10 * time.Second).Unix()})))
		mustVerify(t, a, hs(ok(map[string]any{"nbf": t0.Add(10 * time.Second).Unix()})))
		mustRefuse(t, a, hs(ok(map[string]any{"exp": t0.Add(-40 * time.Second).Unix()})), "expired")
		strict := hsAuth(t, func(o *Options) { o.Leeway = -1 })
		mustRefuse(t, strict, hs(claims(map[string]any{"exp": t0.Add(-time.Second).Unix()})), "expired")
	})
	t.Run("missing tier uses DefaultTier", func(t *testing.T) {
		if p := mustVerify(t, a, hs(ok(map[string]any{"tier": nil}))); p.Tier != "free" {
			t.Fatalf("tier = %q, want free", p.Tier)
		}
		if p := mustVerify(t, a, hs(ok(map[string]any{"tier": ""}))); p.Tier != "free" {
			t.Fatalf("tier = %q, want free", p.Tier)
		}
	})
	t.Run("missing sub", func(t *testing.T) {
		if p := mustVerify(t, a, hs(ok(map[string]any{"sub": nil}))); p.Subject != "" {
			t.Fatalf("subject = %q", p.Subject)
		}
		strict := hsAuth(t, func(o *Options) { o.RequireSubject = true })
		mustRefuse(t, strict, hs(claims(map[string]any{"sub": nil})), "missing sub")
	})
	t.Run("Expiry is the exp claim", func(t *testing.T) {
		for _, exp := range []float64{float64(t0.Add(time.Hour).Unix()), 2e12} {
			if p := mustVerify(t, a, hs(ok(map[string]any{"exp": exp}))); !p.Expiry.Equal(time.Unix(int64(exp), 0)) {
				t.Errorf("exp %v: Expiry = %v", exp, p.Expiry)
			}
		}
		if p := mustVerify(t, a, hs(ok(map[string]any{"exp": nil}))); !p.Expiry.IsZero() {
			t.Errorf("no exp: Expiry = %v, want zero", p.Expiry)
		}
	})
	t.Run("missing exp", func(t *testing.T) {
		mustVerify(t, a, hs(ok(map[string]any{"exp": nil})))
		strict := hsAuth(t, func(o *Options) { o.RequireExpiry = true })
		mustRefuse(t, strict, hs(claims(map[string]any{"exp": nil})), "missing claim")
	})
	t.Run("custom claim names and scope array", func(t *testing.T) {
		c := hsAuth(t, func(o *Options) { o.TenantClaim = "org"; o.TierClaim = "plan"; o.ScopeClaim = "scp" })
		p := mustVerify(t, c, hs(map[string]any{"org": "o1", "plan": "gold", "scp": []string{"tools:*"}, "exp": t0.Add(time.Minute).Unix()}))
		if p.Tenant != "o1" || p.Tier != "gold" || !p.Scopes.AllowsTool("anything") {
			t.Fatalf("principal = %+v", p)
		}
		mustRefuse(t, c, hs(claims(nil)), `missing tenant claim "org"`)
	})
	t.Run("no scope claim grants nothing", func(t *testing.T) {
		p := mustVerify(t, a, hs(ok(map[string]any{"scope": nil})))
		if p.Scopes.AllowsTool("search") {
			t.Fatal("a token without scopes may use a tool")
		}
	})
}

func TestAlgNone(t *testing.T) {
	rsaA, _ := rsaKeys(t)
	auths := map[string]*Authenticator{
		"hs256": hsAuth(t, nil),
		"pem":   newAuth(t, Options{PublicKeyFile: writePEM(t, &rsaA.PublicKey), Now: newClock().Now}),
		"jwks":  newAuth(t, Options{JWKSFile: writeFile(t, "k.json", jwksJSON(t, []any{&rsaA.PublicKey}, []string{"k1"}, nil)), Now: newClock().Now}),
	}
	for name, a := range auths {
		t.Run(name, func(t *testing.T) {
			for _, alg := range []string{"none", "None", "NONE", ""} {
				tok := rawToken(t, map[string]any{"alg": alg, "kid": "k1"}, claims(nil), nil)
				mustRefuse(t, a, tok, "never accepted")
			}
			mustRefuse(t, a, rawToken(t, map[string]any{"typ": "JWT", "kid": "k1"}, claims(nil), nil), "no usable alg")
			mustRefuse(t, a, rawToken(t, map[string]any{"alg": 1, "kid": "k1"}, claims(nil), nil), "no usable alg")
			// "none" with a signature that happens to be present.
			mustRefuse(t, a, rawToken(t, map[string]any{"alg": "none"}, claims(nil), []byte("x")), "never accepted")
		})
	}
}

func TestWrongKey(t *testing.T) {
	a := hsAuth(t, nil)
	other := []byte("ffffffffffffffffffffffffffffffff")
	tok, _ := SignHS256(other, claims(nil))
	mustRefuse(t, a, tok, "bad signature")

	rsaA, rsaB := rsaKeys(t)
	r := newAuth(t, Options{PublicKeyFile: writePEM(t, &rsaA.PublicKey), Now: newClock().Now})
	mustRefuse(t, r, sign(t, jwa.RS256(), rsaB, "", claims(nil)), "bad signature")

	// A valid token with one claim changed after signing.
	good, _ := SignHS256(testSecret, claims(nil))
	parts := strings.Split(good, ".")
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(`{"tenant_id":"victim","exp":1900000000}`))
	mustRefuse(t, a, strings.Join(parts, "."), "bad signature")
}

func TestAlgConfusion(t *testing.T) {
	rsaA, _ := rsaKeys(t)
	pemPath := writePEM(t, &rsaA.PublicKey)
	pemBytes, err := os.ReadFile(pemPath)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&rsaA.PublicKey)

	t.Run("RSA key refuses HS256 signed with the public key", func(t *testing.T) {
		a := newAuth(t, Options{PublicKeyFile: pemPath, Now: newClock().Now})
		for _, secret := range [][]byte{pemBytes, der} {
			mustRefuse(t, a, sign(t, jwa.HS256(), secret, "", claims(nil)), `alg "HS256" is not accepted`)
		}
	})
	t.Run("JWKS RSA key refuses HS256 signed with the public key", func(t *testing.T) {
		a := newAuth(t, Options{JWKSFile: writeFile(t, "k.json", jwksJSON(t, []any{&rsaA.PublicKey}, []string{"k1"}, nil)), Now: newClock().Now})
		mustRefuse(t, a, sign(t, jwa.HS256(), pemBytes, "k1", claims(nil)), `alg "HS256" is not accepted`)
	})
	t.Run("HS256 secret refuses RS256", func(t *testing.T) {
		a := hsAuth(t, nil)
		mustRefuse(t, a, sign(t, jwa.RS256(), rsaA, "", claims(nil)), `alg "RS256" is not accepted`)
		// Only HS256: HS512 with the right secret is refused too.
		mustRefuse(t, a, sign(t, jwa.HS512(), testSecret, "", claims(nil)), `alg "HS512" is not accepted`)
	})
	t.Run("pinned JWK alg", func(t *testing.T) {
		a := newAuth(t, Options{JWKSFile: writeFile(t, "k.json", jwksJSON(t, []any{&rsaA.PublicKey}, []string{"k1"}, []string{"RS256"})), Now: newClock().Now})
		mustVerify(t, a, sign(t, jwa.RS256(), rsaA, "k1", claims(nil)))
		mustRefuse(t, a, sign(t, jwa.PS256(), rsaA, "k1", claims(nil)), `alg "PS256" is not accepted`)
	})
}

func TestCritAndB64Refused(t *testing.T) {
	a := hsAuth(t, nil)
	payload, _ := json.Marshal(claims(nil))
	// Validly signed, so only the header can be the reason for refusal.
	mustVerify(t, a, signRaw(t, testSecret, `{"alg":"HS256"}`, payload))
	mustRefuse(t, a, signRaw(t, testSecret, `{"alg":"HS256","crit":["x-ext"],"x-ext":1}`, payload), `"crit"`)
	mustRefuse(t, a, signRaw(t, testSecret, `{"alg":"HS256","b64":true}`, payload), `"b64"`)
}

func TestGarbage(t *testing.T) {
	a := hsAuth(t, nil)
	enc := base64.RawURLEncoding.EncodeToString
	for name, c := range map[string]struct{ tok, want string }{
		"empty":            {"", "empty token"},
		"one part":         {"abc", "not a JWS compact token"},
		"two parts":        {"a.b", "not a JWS compact token"},
		"JWE (five parts)": {"a.b.c.d.e", "not a JWS compact token"},
		"dots":             {"..", "no usable alg"},
		"header not b64":   {"!!!.e30.sig", "not a JWS compact token"},
		"header not JSON":  {enc([]byte("nope")) + ".e30.c2ln", "no usable alg"},
		"header array":     {enc([]byte(`["alg"]`)) + ".e30.c2ln", "no usable alg"},
		"unknown alg":      {enc([]byte(`{"alg":"XX999"}`)) + ".e30.c2ln", `alg "XX999" is not accepted`},
		"bad signature b64": {
			enc([]byte(`{"alg":"HS256"}`)) + ".e30.!!!", "not a JWS compact token"},
	} {
		t.Run(name, func(t *testing.T) { mustRefuse(t, a, c.tok, c.want) })
	}

	// Payloads that verify but are not a claims object.
	for name, payload := range map[string][]byte{
		"array":      []byte(`["tenant_id"]`),
		"string":     []byte(`"acme"`),
		"empty":      {},
		"nested JWS": []byte(sign(t, jwa.HS256(), testSecret, "", claims(nil))),
	} {
		t.Run("payload "+name, func(t *testing.T) {
			tok := signRaw(t, testSecret, `{"alg":"HS256"}`, payload)
			mustRefuse(t, a, tok, "payload is not a JSON object")
		})
	}
}

// A token is one string. Its signature written another way (padded, in
// the standard alphabet, with the unused low bits of its last character
// set) decodes to the same bytes under a lenient decoder, but it is not
// base64url (RFC 7515 §2): accepting it would give one token several
// accepted spellings, each cached as a token of its own, none of which a
// denylist of the issued string would match, and which stricter verifiers
// refuse. Only the canonical form verifies, and the cache holds it alone.
func TestNonCanonicalEncodingRefused(t *testing.T) {
	a := hsAuth(t, nil)
	// A signature with '-' or '_', so that the standard alphabet differs.
	var tok string
	for i := 0; ; i++ {
		tok = sign(t, jwa.HS256(), testSecret, "", claims(map[string]any{"jti": fmt.Sprint(i)}))
		if strings.ContainsAny(tok[strings.LastIndexByte(tok, '.'):], "-_") {
			break
		}
	}
	mustVerify(t, a, tok)
	dot := strings.LastIndexByte(tok, '.')
	sig, err := base64.RawURLEncoding.Strict().DecodeString(tok[dot+1:])
	if err != nil || len(sig) != 32 {
		t.Fatalf("test signature: %d bytes, %v", len(sig), err)
	}
	variants := map[string]string{
		"padded":                  tok + "=",
		"std alphabet":            tok[:dot+1] + base64.RawStdEncoding.EncodeToString(sig),
		"std alphabet and padded": tok[:dot+1] + base64.StdEncoding.EncodeToString(sig),
		"newline inside":          tok[:dot+5] + "\n" + tok[dot+5:],
		"space inside":            tok[:dot+5] + " " + tok[dot+5:],
		"impossible length":       tok + "AA",
		"header padded":           strings.Replace(tok, ".", "=.", 1),
	}
	// 32 bytes are 43 characters: the last one carries 4 bits of the
	// signature and 2 unused ones, which base64url wants zero.
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alpha, tok[len(tok)-1])
	for bits := 1; bits < 4; bits++ {
		variants[fmt.Sprintf("trailing bits %02b", bits)] = tok[:len(tok)-1] + string(alpha[last^bits])
	}
	for name, v := range variants {
		t.Run(name, func(t *testing.T) { mustRefuse(t, a, v, "not a JWS compact token") })
	}
	a.cache.mu.Lock()
	n := len(a.cache.m)
	a.cache.mu.Unlock()
	if n != 1 {
		t.Fatalf("the cache holds %d entries for one token", n)
	}
}

// signRaw HS256-signs an arbitrary header and payload with crypto/hmac, so a
// test controls every byte that the signature covers.
func signRaw(t *testing.T, secret []byte, header string, payload []byte) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	input := enc([]byte(header)) + "." + enc(payload)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(input))
	return input + "." + enc(m.Sum(nil))
}

func TestOversize(t *testing.T) {
	a := hsAuth(t, nil)
	// Just under the limit passes: the bound is on size, not on claims.
	big, _ := SignHS256(testSecret, claims(map[string]any{"pad": strings.Repeat("x", 11_000)}))
	if len(big) > MaxTokenBytes {
		t.Fatalf("test token is %d bytes", len(big))
	}
	mustVerify(t, a, big)
	huge, _ := SignHS256(testSecret, claims(map[string]any{"pad": strings.Repeat("x", MaxTokenBytes)}))
	mustRefuse(t, a, huge, "more than 16384")
	mustRefuse(t, a, strings.Repeat("a", MaxTokenBytes+1), "more than 16384")
}

func TestFromRequest(t *testing.T) {
	a := hsAuth(t, nil)
	tok, _ := SignHS256(testSecret, claims(nil))
	req := func(vals ...string) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, "http://gw/mcp", nil)
		for _, v := range vals {
			r.Header.Add("Authorization", v)
		}
		return r
	}
	ctx := context.Background()
	for _, r := range []*http.Request{req(), req("Basic dXNlcjpwYXNz"), req("Token " + tok), req("")} {
		if _, err := a.FromRequest(ctx, r); !errors.Is(err, ErrNoToken) {
			t.Fatalf("Authorization %q: err = %v, want ErrNoToken", r.Header.Get("Authorization"), err)
		}
	}
	for _, v := range []string{"Bearer " + tok, "bearer " + tok, "BEARER  " + tok + " "} {
		if p, err := a.FromRequest(ctx, req(v)); err != nil || p.Tenant != "acme" {
			t.Fatalf("Authorization %q: %+v, %v", v, p, err)
		}
	}
	for _, r := range []*http.Request{req("Bearer"), req("Bearer "), req("Bearer "+tok, "Bearer "+tok), req("Bearer garbage")} {
		if _, err := a.FromRequest(ctx, r); !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("Authorization %q: err = %v, want ErrInvalidToken", r.Header.Values("Authorization"), err)
		}
	}
}

func TestNewValidation(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]struct {
		opts Options
		want string
	}{
		"no key source":    {Options{}, "exactly one"},
		"two key sources":  {Options{HS256Secret: testSecret, JWKSFile: "x.json"}, "(2 are)"},
		"leeway too large": {Options{HS256Secret: testSecret, Leeway: time.Hour}, "more than 5m"},
		"negative refresh": {Options{HS256Secret: testSecret, JWKSRefresh: -time.Second}, "negative"},
		"missing PEM":      {Options{PublicKeyFile: "/nonexistent/key.pem"}, "reading public key file"},
		"missing JWKS":     {Options{JWKSFile: "/nonexistent/jwks.json"}, "reading JWKS file"},
		"bad JWKS URL":     {Options{JWKSURL: "ftp://idp/jwks"}, "http(s)"},
		"relative URL":     {Options{JWKSURL: "/jwks.json"}, "http(s)"},
	} {
		t.Run(name, func(t *testing.T) {
			a, err := New(ctx, c.opts)
			if err == nil {
				_ = a.Close()
				t.Fatal("New accepted invalid options")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

func TestSecretCopied(t *testing.T) {
	secret := append([]byte(nil), testSecret...)
	a := hsAuth(t, func(o *Options) { o.HS256Secret = secret })
	tok, _ := SignHS256(testSecret, claims(nil))
	secret[0] ^= 0xff
	mustVerify(t, a, tok)
}

// BenchmarkVerify measures a token's first verification (no cache: what
// every new token costs, the signature check aside for HS256) and a cached
// one (what every later call with it costs).
//
//	go test -run '^$' -bench BenchmarkVerify -benchmem ./auth/
func BenchmarkVerify(b *testing.B) {
	ctx := context.Background()
	ec := ecKey(b, elliptic.P256())
	for _, c := range []struct {
		name string
		opts Options
		tok  string
	}{
		{"HS256", Options{HS256Secret: testSecret}, sign(b, jwa.HS256(), testSecret, "", claims(nil))},
		{"ES256", Options{PublicKeyFile: writePEM(b, &ec.PublicKey)}, sign(b, jwa.ES256(), ec, "", claims(nil))},
	} {
		c.opts.Now = newClock().Now
		a := newAuth(b, c.opts)
		b.Run(c.name+"/uncached", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.verifyToken(ctx, c.tok); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/cached", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.Verify(ctx, c.tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
