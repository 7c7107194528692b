package auth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/usage"
)

// hsToken signs payload (any bytes) under HS256 with testSecret: the token
// an issuer holding the secret would mint, so that the fuzzer reaches the
// claims checks instead of the signature check.
func hsToken(payload []byte) string {
	enc := base64.RawURLEncoding
	h := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	in := h + "." + enc.EncodeToString(payload)
	m := hmac.New(sha256.New, testSecret)
	m.Write([]byte(in))
	return in + "." + enc.EncodeToString(m.Sum(nil))
}

// topMembers returns every value of each top-level member of a JSON object,
// in order (duplicates kept), or false when payload is not one.
func topMembers(payload []byte) (map[string][]json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	out := map[string][]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		out[k] = append(out[k], v)
	}
	return out, true
}

// FuzzClaims: for any payload signed with the right key, Verify never
// panics, and what it accepts
//   - has a tenant the usage layer bills (usage.CheckTenant): the two
//     layers keep one rule;
//   - has the tenant, subject and tier of the last member of that name
//     (RFC 7519 section 4: duplicates are refused or read last-wins), the
//     tenant encoding/json reads, and a numeric exp, nbf and iat (the last
//     member of each).
func FuzzClaims(f *testing.F) {
	for _, c := range []string{
		`{"tenant_id":"acme","sub":"u","exp":1800003600,"iat":1800000000}`,
		`{"tenant_id":"acme","tenant_id":"evil","exp":1800003600}`,
		`{"tenant_id":"acme","sub":"u","exp":"2099-01-01T00:00:00Z"}`,
		`{"tenant_id":"acme","exp":1800003600,"exp":1}`,
		`{"tenant_id":"a\u0000b"}`,
		`{"tenant_id":"ab","scope":["tools:*"]}`,
		`{"tenant_id":"a\ufffd"}`,
		`{"tenant_id":"a\udc00"}`,
		`{"tenant_id":"x","tier":"pro","tier":"free","scope":"tools:a","scope":"tools:*"}`,
	} {
		f.Add([]byte(c))
	}
	a := newAuth(f, Options{HS256Secret: testSecret, Now: newClock().Now})
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, payload []byte) {
		tok := hsToken(payload)
		if len(tok) > MaxTokenBytes {
			return
		}
		p, err := a.Verify(ctx, tok)
		if err != nil {
			return
		}
		if err := usage.CheckTenant(p.Tenant); err != nil {
			t.Fatalf("accepted tenant %q that usage refuses: %v (payload %q)", p.Tenant, err, payload)
		}
		ms, ok := topMembers(payload)
		if !ok {
			t.Fatalf("accepted a payload encoding/json cannot read as an object: %q", payload)
		}
		// RFC 7519 section 4 allows last-member-wins on duplicates: the
		// Principal must be what that reading gives, member by member.
		last := func(name string) (string, bool) {
			vs := ms[name]
			if len(vs) == 0 {
				return "", false
			}
			var s string
			if err := json.Unmarshal(vs[len(vs)-1], &s); err != nil {
				t.Fatalf("accepted %s %s, not a string (payload %q)", name, vs[len(vs)-1], payload)
			}
			return s, true
		}
		if s, _ := last("tenant_id"); s != p.Tenant {
			t.Fatalf("tenant %q, last tenant_id member %q (payload %q)", p.Tenant, s, payload)
		}
		// No identity holds U+FFFD: a decoder's repair of invalid UTF-8 or
		// of a lone surrogate escape would merge distinct claims.
		for _, v := range []string{p.Tenant, p.Subject, p.Tier} {
			if strings.ContainsRune(v, utf8.RuneError) {
				t.Fatalf("accepted identity %q holding U+FFFD (payload %q)", v, payload)
			}
		}
		if s, _ := last("sub"); s != p.Subject {
			t.Fatalf("subject %q, last sub member %q (payload %q)", p.Subject, s, payload)
		}
		if s, ok := last("tier"); ok && s != "" && s != p.Tier {
			t.Fatalf("tier %q, last tier member %q (payload %q)", p.Tier, s, payload)
		}
		for _, name := range []string{"exp", "nbf", "iat"} {
			if vs := ms[name]; len(vs) > 0 {
				v := vs[len(vs)-1]
				var n json.Number
				if err := json.Unmarshal(v, &n); err != nil {
					t.Fatalf("accepted %s %s, not a NumericDate (payload %q)", name, v, payload)
				}
			}
		}
		if vs := ms["exp"]; len(vs) > 0 {
			var n float64
			_ = json.Unmarshal(vs[len(vs)-1], &n)
			if want := time.Unix(int64(n), 0); !p.Expiry.Equal(want) && n < 1e15 && n > -1e15 {
				t.Fatalf("expiry %v, last exp member %s (payload %q)", p.Expiry, vs[len(vs)-1], payload)
			}
		}
		var std map[string]any
		if err := json.Unmarshal(payload, &std); err != nil {
			t.Fatalf("accepted payload encoding/json refuses: %v (payload %q)", err, payload)
		}
		if std["tenant_id"] != p.Tenant {
			t.Fatalf("tenant %q, encoding/json reads %v (payload %q)", p.Tenant, std["tenant_id"], payload)
		}
	})
}
