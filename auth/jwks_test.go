package auth

import (
	"context"
	"crypto/elliptic"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

func TestJWKSFile(t *testing.T) {
	rsaA, _ := rsaKeys(t)
	ec := ecKey(t, elliptic.P256())
	path := writeFile(t, "jwks.json", jwksJSON(t, []any{&rsaA.PublicKey, &ec.PublicKey}, []string{"rsa-1", "ec-1"}, nil))
	a := newAuth(t, Options{JWKSFile: path, Now: newClock().Now})

	mustVerify(t, a, sign(t, jwa.RS256(), rsaA, "rsa-1", claims(nil)))
	mustVerify(t, a, sign(t, jwa.ES256(), ec, "ec-1", claims(nil)))
	// The kid selects the key: an EC token that names the RSA key fails on
	// the RSA key's algorithms, it is not tried against the EC key.
	mustRefuse(t, a, sign(t, jwa.ES256(), ec, "rsa-1", claims(nil)), `alg "ES256" is not accepted`)
	mustRefuse(t, a, sign(t, jwa.RS256(), rsaA, "ec-1", claims(nil)), `alg "RS256" is not accepted`)
	mustRefuse(t, a, sign(t, jwa.RS256(), rsaA, "rsa-2", claims(nil)), `unknown kid "rsa-2"`)
	mustRefuse(t, a, sign(t, jwa.RS256(), rsaA, "", claims(nil)), "no kid and the key set holds 2")

	t.Run("one key accepts a token without kid", func(t *testing.T) {
		one := newAuth(t, Options{JWKSFile: writeFile(t, "one.json", jwksJSON(t, []any{&ec.PublicKey}, []string{"ec-1"}, nil)), Now: newClock().Now})
		mustVerify(t, one, sign(t, jwa.ES256(), ec, "", claims(nil)))
	})
	t.Run("symmetric and encryption keys are skipped", func(t *testing.T) {
		set := `{"keys":[
			{"kty":"oct","kid":"hs","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"},
			` + strings.TrimSuffix(strings.TrimPrefix(string(jwksJSON(t, []any{&ec.PublicKey}, []string{"enc-1"}, nil)), `{"keys":[`), `]}`) + `]}`
		set = strings.Replace(set, `"kid":"enc-1"`, `"kid":"enc-1","use":"enc"`, 1)
		_, err := New(context.Background(), Options{JWKSFile: writeFile(t, "skip.json", []byte(set))})
		if err == nil || !strings.Contains(err.Error(), "no usable signing key") || !strings.Contains(err.Error(), "symmetric") {
			t.Fatalf("New error = %v", err)
		}
	})
	t.Run("broken file", func(t *testing.T) {
		_, err := New(context.Background(), Options{JWKSFile: writeFile(t, "bad.json", []byte(`{"keys":[{"kty":"RSA"}]}`))})
		if err == nil {
			t.Fatal("New accepted a broken JWKS file")
		}
	})
}

// A JWK's key_ops (RFC 7517 §4.3) says what the key is for: one that
// lists operations but not "verify" is no verification key, just as one
// with use "enc" is not, and is skipped; with use "sig", key_ops must not
// name anything but signing (§4.3: use and key_ops MUST agree).
func TestJWKSKeyOps(t *testing.T) {
	for name, c := range map[string]struct {
		members string // added to the JWK
		ok      bool
	}{
		"encrypt and wrapKey": {`"key_ops":["encrypt","wrapKey"]`, false},
		// The parser reads null as an empty list, and serializers that
		// write every member write null for "nothing said": both pass.
		"empty":                          {`"key_ops":[]`, true},
		"null":                           {`"key_ops":null`, true},
		"sign only":                      {`"key_ops":["sign"]`, false},
		"verify":                         {`"key_ops":["verify"]`, true},
		"sign and verify":                {`"key_ops":["sign","verify"]`, true},
		"use sig, verify":                {`"use":"sig","key_ops":["verify"]`, true},
		"use sig, verify and encrypt":    {`"use":"sig","key_ops":["verify","encrypt"]`, false},
		"use sig, decrypt":               {`"use":"sig","key_ops":["decrypt"]`, false},
		"use enc, verify (inconsistent)": {`"use":"enc","key_ops":["verify"]`, false},
	} {
		t.Run(name, func(t *testing.T) {
			ec, other := ecKey(t, elliptic.P256()), ecKey(t, elliptic.P256())
			set := string(jwksJSON(t, []any{&ec.PublicKey, &other.PublicKey}, []string{"ops", "other"}, nil))
			set = strings.Replace(set, `"kid":"ops"`, `"kid":"ops",`+c.members, 1)
			a := newAuth(t, Options{JWKSFile: writeFile(t, "ops.json", []byte(set)), Now: newClock().Now, Logger: slog.New(slog.DiscardHandler)})
			mustVerify(t, a, sign(t, jwa.ES256(), other, "other", claims(nil)))
			tok := sign(t, jwa.ES256(), ec, "ops", claims(nil))
			if c.ok {
				mustVerify(t, a, tok)
				return
			}
			mustRefuse(t, a, tok, `unknown kid "ops"`)
		})
	}
}

// jwksServer serves a JWKS that tests can replace, and counts requests.
type jwksServer struct {
	*httptest.Server
	mu       sync.Mutex
	body     []byte
	status   int
	requests atomic.Int64
}

func newJWKSServer(t *testing.T, body []byte) *jwksServer {
	t.Helper()
	s := &jwksServer{body: body, status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.requests.Add(1)
		s.mu.Lock()
		body, status := s.body, s.status
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(body []byte) {
	s.mu.Lock()
	s.body = body
	s.mu.Unlock()
}

func TestJWKSURLRotation(t *testing.T) {
	k1, k2, k3 := ecKey(t, elliptic.P256()), edKey(t), ecKey(t, elliptic.P256())
	srv := newJWKSServer(t, jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil))
	clk := newClock()
	a := newAuth(t, Options{JWKSURL: srv.URL + "/jwks.json", Now: clk.Now})
	if n := srv.requests.Load(); n != 1 {
		t.Fatalf("New made %d requests, want 1", n)
	}

	mustVerify(t, a, sign(t, jwa.ES256(), k1, "k1", claims(nil)))
	if n := srv.requests.Load(); n != 1 {
		t.Fatalf("a known kid made a request (%d)", n)
	}

	// The identity provider rotates in k2: the first k2 tokens, arriving
	// together, cause one refresh and all pass.
	srv.set(jwksJSON(t, []any{&k1.PublicKey, k2.Public()}, []string{"k1", "k2"}, nil))
	k2tok := sign(t, jwa.EdDSA(), k2, "k2", claims(nil))
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, err := a.Verify(context.Background(), k2tok); err != nil {
				t.Errorf("k2 token after rotation: %v", err)
			}
		})
	}
	wg.Wait()
	if n := srv.requests.Load(); n != 2 {
		t.Fatalf("after rotation: %d requests, want 2", n)
	}
	mustVerify(t, a, sign(t, jwa.EdDSA(), k2, "k2", claims(nil)))
	if n := srv.requests.Load(); n != 2 {
		t.Fatalf("second k2 token refetched: %d requests", n)
	}

	// A forged kid right after a refresh is refused without a request.
	burst := func(n int, kid string) {
		t.Helper()
		tok := sign(t, jwa.ES256(), k3, kid, claims(nil))
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				_, err := a.Verify(context.Background(), tok)
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), `unknown kid "`+kid+`"`) {
				t.Fatalf("unknown kid: err = %v", err)
			}
		}
	}
	burst(50, "k3")
	if n := srv.requests.Load(); n != 2 {
		t.Fatalf("burst within %s of a refresh made requests: %d, want 2", MissRefreshInterval, n)
	}

	// Once the interval has passed, a burst of unknown kids costs exactly one
	// request, and the kid is still refused after it.
	clk.Advance(MissRefreshInterval + time.Second)
	burst(50, "k3")
	if n := srv.requests.Load(); n != 3 {
		t.Fatalf("burst after the interval: %d requests, want 3", n)
	}
	err := mustRefuse(t, a, sign(t, jwa.ES256(), k3, "k4", claims(nil)), "unknown kid")
	if !strings.Contains(err.Error(), "refreshed less than") {
		t.Fatalf("error does not say the refresh was rate-limited: %v", err)
	}

	// k1 is removed and k3 added: after the next refresh k1 is no longer
	// trusted and k3 is.
	srv.set(jwksJSON(t, []any{k2.Public(), &k3.PublicKey}, []string{"k2", "k3"}, nil))
	clk.Advance(MissRefreshInterval + time.Second)
	mustVerify(t, a, sign(t, jwa.ES256(), k3, "k3", claims(nil)))
	mustRefuse(t, a, sign(t, jwa.ES256(), k1, "k1", claims(nil)), `unknown kid "k1"`)
	if n := srv.requests.Load(); n != 4 {
		t.Fatalf("%d requests, want 4", n)
	}
}

func TestJWKSURLFirstBurst(t *testing.T) {
	k1 := ecKey(t, elliptic.P256())
	srv := newJWKSServer(t, jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil))
	a := newAuth(t, Options{JWKSURL: srv.URL, Now: newClock().Now})
	tok := sign(t, jwa.ES256(), k1, "forged", claims(nil))
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if _, err := a.Verify(context.Background(), tok); !errors.Is(err, ErrInvalidToken) {
				t.Errorf("err = %v", err)
			}
		})
	}
	wg.Wait()
	if n := srv.requests.Load(); n != 2 {
		t.Fatalf("100 concurrent forged kids: %d requests, want 2 (start + one refresh)", n)
	}
}

// A slow identity provider: a refresh takes longer than
// MissRefreshInterval. The verifications that arrived while it ran use its
// result; none starts another refresh when it ends (each would, in turn,
// the interval having passed: the n-th caller would wait n refreshes).
func TestJWKSURLSlowRefreshServesItsWaiters(t *testing.T) {
	k1 := ecKey(t, elliptic.P256())
	body := jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil)
	clk := newClock()
	release := make(chan struct{})
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch requests.Add(1) {
		case 1: // New's fetch
		case 2:
			clk.Advance(MissRefreshInterval + time.Second)
			<-release
		default:
			clk.Advance(MissRefreshInterval + time.Second)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	a := newAuth(t, Options{JWKSURL: srv.URL, Now: clk.Now})

	const callers = 5
	tok := sign(t, jwa.ES256(), k1, "forged", claims(nil))
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := a.Verify(context.Background(), tok)
			errs <- err
		}()
	}
	testenv.Eventually(t, 10*time.Second, "every caller to wait for the refresh", func() bool {
		return inRefreshOnMiss() == callers
	})
	close(release)
	for range callers {
		if err := <-errs; !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), `unknown kid "forged"`) {
			t.Errorf("err = %v, want unknown kid", err)
		}
	}
	if n := requests.Load() - 1; n != 1 {
		t.Fatalf("%d callers waiting for one refresh caused %d refreshes, want 1", callers, n)
	}
}

// inRefreshOnMiss counts the goroutines inside remoteKeys.refreshOnMiss.
func inRefreshOnMiss() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "(*remoteKeys).refreshOnMiss(")
}

func TestJWKSURLFailFast(t *testing.T) {
	k1 := ecKey(t, elliptic.P256())
	good := jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil)

	t.Run("server error", func(t *testing.T) {
		srv := newJWKSServer(t, good)
		srv.status = http.StatusInternalServerError
		assertNewFails(t, srv.URL, "status code=500")
	})
	t.Run("not JSON", func(t *testing.T) {
		srv := newJWKSServer(t, []byte("<html>"))
		assertNewFails(t, srv.URL, "fetching JWKS")
	})
	t.Run("no usable key", func(t *testing.T) {
		srv := newJWKSServer(t, []byte(`{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}`))
		assertNewFails(t, srv.URL, "no usable signing key")
	})
	t.Run("unreachable", func(t *testing.T) {
		srv := newJWKSServer(t, good)
		u := srv.URL
		srv.Close()
		assertNewFails(t, u, "fetching JWKS")
	})
	t.Run("context deadline", func(t *testing.T) {
		block := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-block }))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(block) })
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := New(ctx, Options{JWKSURL: srv.URL})
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("New error = %v, want deadline exceeded", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("New took %s", d)
		}
	})
}

// Credentials in the JWKS URL (a password, a key in the query or as the
// user name) stay out of New's error, Verify's (logged for every refused
// token) and the refresh log, whatever net/http and httprc write of the
// URL; the errors still unwrap to their causes.
func TestJWKSURLCredentialsStayOutOfErrors(t *testing.T) {
	k1 := ecKey(t, elliptic.P256())
	body := jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil)
	withCreds := map[string]func(base string) string{
		"password":           func(b string) string { return strings.Replace(b, "//", "//user:SECRET@", 1) + "/jwks" },
		"escaped password":   func(b string) string { return strings.Replace(b, "//", "//us%20er:p%40SECRET%2F@", 1) + "/jwks" },
		"query key":          func(b string) string { return b + "/jwks?api_key=SECRET" },
		"key as user name":   func(b string) string { return strings.Replace(b, "//", "//SECRET@", 1) + "/jwks" },
		"password and query": func(b string) string { return strings.Replace(b, "//", "//u:SECRET@", 1) + "/jwks?key=SECRET#SECRET" },
	}
	for name, creds := range withCreds {
		t.Run(name, func(t *testing.T) {
			var log testenv.SyncBuffer
			srv := newJWKSServer(t, body)
			u := creds(srv.URL)
			opts := Options{JWKSURL: u, Now: newClock().Now, Logger: slog.New(slog.NewTextHandler(&log, nil))}
			a := newAuth(t, opts)
			forged := sign(t, jwa.ES256(), k1, "forged", claims(nil))
			var errs []error
			srv.mu.Lock()
			srv.status = http.StatusServiceUnavailable
			srv.mu.Unlock()
			_, err := a.Verify(context.Background(), forged) // a refresh answered 503
			errs = append(errs, err)
			_, err = New(context.Background(), opts) // a start answered 503
			errs = append(errs, err)
			srv.Close()
			_, err = New(context.Background(), opts) // a start that cannot connect
			if !errors.As(err, new(*url.Error)) {
				t.Errorf("New's error lost its *url.Error: %v", err)
			}
			errs = append(errs, err)
			for i, err := range errs {
				if err == nil || strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), "/jwks") {
					t.Errorf("error %d: %v, want one naming the URL without its credentials", i, err)
				}
			}
			if strings.Contains(log.String(), "SECRET") {
				t.Errorf("credential in the log:\n%s", log.String())
			}
		})
	}
	t.Run("background refresh", func(t *testing.T) {
		var log testenv.SyncBuffer
		srv := newJWKSServer(t, body)
		newAuth(t, Options{JWKSURL: withCreds["password and query"](srv.URL), JWKSRefresh: time.Second, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		srv.mu.Lock()
		srv.status = http.StatusServiceUnavailable
		srv.mu.Unlock()
		testenv.Eventually(t, 30*time.Second, "a background refresh to fail", func() bool {
			return strings.Contains(log.String(), "JWKS refresh failed")
		})
		if strings.Contains(log.String(), "SECRET") {
			t.Errorf("credential in the log:\n%s", log.String())
		}
	})
	t.Run("does not parse", func(t *testing.T) {
		_, err := New(context.Background(), Options{JWKSURL: "http://user:SECRET@idp:port/jwks"})
		if err == nil || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("New: %v, want an error without the credential", err)
		}
	})
}

func assertNewFails(t *testing.T, url, want string) {
	t.Helper()
	start := time.Now()
	a, err := New(context.Background(), Options{JWKSURL: url})
	if err == nil {
		_ = a.Close()
		t.Fatal("New succeeded")
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("New error %q does not contain %q", err, want)
	}
	// Fail fast: the reason arrives with the first response, not after a
	// start-up timeout.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("New took %s to fail", d)
	}
}

func TestJWKSURLServerDownKeepsKeys(t *testing.T) {
	k1 := ecKey(t, elliptic.P256())
	srv := newJWKSServer(t, jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil))
	a := newAuth(t, Options{JWKSURL: srv.URL, Now: newClock().Now})
	srv.mu.Lock()
	srv.status = http.StatusServiceUnavailable
	srv.mu.Unlock()
	err := mustRefuse(t, a, sign(t, jwa.ES256(), k1, "k2", claims(nil)), `unknown kid "k2"`)
	if !strings.Contains(err.Error(), "status code=503") {
		t.Fatalf("error does not carry the refresh failure: %v", err)
	}
	// The keys fetched before the outage still verify.
	mustVerify(t, a, sign(t, jwa.ES256(), k1, "k1", claims(nil)))
}

// A refresh that brings a set with no usable key (empty, or only keys of
// a type we skip) keeps the keys in use: rejecting every token until the
// next good set would make one glitch of the identity provider an outage.
// The next set with a usable key replaces them.
func TestJWKSURLRefreshWithoutUsableKeyKeepsKeys(t *testing.T) {
	k1, k2 := ecKey(t, elliptic.P256()), ecKey(t, elliptic.P256())
	srv := newJWKSServer(t, jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil))
	clk := newClock()
	a := newAuth(t, Options{JWKSURL: srv.URL, Now: clk.Now})
	for _, body := range []string{`{"keys":[]}`, `{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}]}`} {
		srv.set([]byte(body))
		clk.Advance(MissRefreshInterval + time.Second)
		mustRefuse(t, a, sign(t, jwa.ES256(), k2, "k2", claims(nil)), `unknown kid "k2"`) // the refresh
		mustVerify(t, a, sign(t, jwa.ES256(), k1, "k1", claims(nil)))
	}
	srv.set(jwksJSON(t, []any{&k2.PublicKey}, []string{"k2"}, nil))
	clk.Advance(MissRefreshInterval + time.Second)
	mustVerify(t, a, sign(t, jwa.ES256(), k2, "k2", claims(nil)))
	mustRefuse(t, a, sign(t, jwa.ES256(), k1, "k1", claims(nil)), `unknown kid "k1"`)
}

func TestCloseThenUnknownKid(t *testing.T) {
	k1 := ecKey(t, elliptic.P256())
	srv := newJWKSServer(t, jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil))
	a, err := New(context.Background(), Options{JWKSURL: srv.URL, Now: newClock().Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	mustVerify(t, a, sign(t, jwa.ES256(), k1, "k1", claims(nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := a.Verify(ctx, sign(t, jwa.ES256(), k1, "k2", claims(nil))); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Verify after Close: %v", err)
	}
}

func TestJWKSURLCustomClient(t *testing.T) {
	k1 := ecKey(t, elliptic.P256())
	srv := newJWKSServer(t, jwksJSON(t, []any{&k1.PublicKey}, []string{"k1"}, nil))
	var seen atomic.Int64
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})}
	a := newAuth(t, Options{JWKSURL: srv.URL, HTTPClient: hc, Now: newClock().Now})
	mustVerify(t, a, sign(t, jwa.ES256(), k1, "k1", claims(nil)))
	if seen.Load() != 1 {
		t.Fatalf("custom client used %d times, want 1", seen.Load())
	}
	// The redirect policy goes on a copy, not on the caller's client.
	if hc.CheckRedirect != nil {
		t.Fatal("New changed the caller's http.Client")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// privateJWKs are JWKs that carry private key material, each with the
// private key that signs for it: what a JWKS must never publish.
func privateJWKs(t *testing.T) map[string]struct {
	jwk  string
	alg  jwa.SignatureAlgorithm
	sign any
} {
	rsaA, _ := rsaKeys(t)
	ec, ed := ecKey(t, elliptic.P256()), edKey(t)
	member := func(priv any) string {
		set := string(jwksJSON(t, []any{priv}, []string{"leaked"}, nil))
		return strings.TrimSuffix(strings.TrimPrefix(set, `{"keys":[`), `]}`)
	}
	// An RSA JWK without "d" but with its primes is private all the same:
	// p and q give d.
	var primes map[string]any
	if err := json.Unmarshal([]byte(member(rsaA)), &primes); err != nil {
		t.Fatal(err)
	}
	delete(primes, "d")
	noD, err := json.Marshal(primes)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]struct {
		jwk  string
		alg  jwa.SignatureAlgorithm
		sign any
	}{
		"RSA":         {member(rsaA), jwa.RS256(), rsaA},
		"RSA primes":  {string(noD), jwa.RS256(), rsaA},
		"EC":          {member(ec), jwa.ES256(), ec},
		"Ed25519 OKP": {member(ed), jwa.EdDSA(), ed},
	}
}

// A JWKS URL is public: a private key published there lets anyone who
// fetches it sign tokens for any tenant. The key is skipped, loudly (an
// error, not a warning), and the set's other keys keep working; a set
// whose only key is private fails New.
func TestJWKSURLPrivateKeySkipped(t *testing.T) {
	pub := ecKey(t, elliptic.P256())
	pubMember := strings.TrimSuffix(strings.TrimPrefix(string(jwksJSON(t, []any{&pub.PublicKey}, []string{"pub"}, nil)), `{"keys":[`), `]}`)
	for name, k := range privateJWKs(t) {
		t.Run(name, func(t *testing.T) {
			var log testenv.SyncBuffer
			srv := newJWKSServer(t, []byte(`{"keys":[`+k.jwk+`,`+pubMember+`]}`))
			a := newAuth(t, Options{JWKSURL: srv.URL, Now: newClock().Now, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			mustRefuse(t, a, sign(t, k.alg, k.sign, "leaked", claims(map[string]any{"tenant_id": "victim"})), `unknown kid "leaked"`)
			mustVerify(t, a, sign(t, jwa.ES256(), pub, "pub", claims(nil)))
			if l := log.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "private key") || !strings.Contains(l, `leaked`) {
				t.Fatalf("no error logged for the published private key:\n%s", l)
			}

			only := newJWKSServer(t, []byte(`{"keys":[`+k.jwk+`]}`))
			assertNewFails(t, only.URL, "private key")
		})
	}
}

// A JWKS file holding a private key is the operator's mistake to fix: New
// fails, naming the key, rather than skip it.
func TestJWKSFilePrivateKeyRefused(t *testing.T) {
	pub := ecKey(t, elliptic.P256())
	pubMember := strings.TrimSuffix(strings.TrimPrefix(string(jwksJSON(t, []any{&pub.PublicKey}, []string{"pub"}, nil)), `{"keys":[`), `]}`)
	for name, k := range privateJWKs(t) {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, "jwks.json", []byte(`{"keys":[`+pubMember+`,`+k.jwk+`]}`))
			a, err := New(context.Background(), Options{JWKSFile: path, Now: newClock().Now})
			if err == nil {
				_ = a.Close()
				t.Fatal("New accepted a JWKS file holding a private key")
			}
			if !errors.Is(err, errPrivateJWK) || !strings.Contains(err.Error(), `"leaked"`) {
				t.Fatalf("New error %q: want errPrivateJWK naming the key", err)
			}
		})
	}
}

// An https JWKS URL whose server redirects to plain http would have its
// keys fetched in cleartext, where anyone on the path can swap them: the
// default client (the one setup.AuthOptions leaves Options.HTTPClient nil
// for) refuses the redirect, and New's error names both URLs without the
// configured URL's credentials. It runs in a child process, because
// SSL_CERT_FILE (which makes the default client trust the httptest
// certificate) is read once per process.
func TestJWKSURLRedirectToHTTPRefused(t *testing.T) {
	const child = "MCPGATE_AUTH_TEST_REDIRECT_CHILD"
	if os.Getenv(child) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestJWKSURLRedirectToHTTPRefused$", "-test.v")
		cmd.Env = append(os.Environ(), child+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestJWKSURLRedirectToHTTPRefused") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	ec := ecKey(t, elliptic.P256())
	plain := newJWKSServer(t, jwksJSON(t, []any{&ec.PublicKey}, []string{"ec-1"}, nil))
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/jwks.json?token=TARGETSECRET", http.StatusFound)
	}))
	defer tlsSrv.Close()
	t.Setenv("SSL_CERT_FILE", writeFile(t, "ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw})))
	var log testenv.SyncBuffer
	a, err := New(context.Background(), Options{
		JWKSURL: strings.Replace(tlsSrv.URL, "//", "//user:SECRET@", 1) + "/jwks.json?key=SECRET",
		Now:     newClock().Now, Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})
	if err == nil {
		defer a.Close()
		_, verr := a.Verify(context.Background(), sign(t, jwa.ES256(), ec, "ec-1", claims(nil)))
		t.Fatalf("https JWKS URL %s redirected to %s: New accepted the keys fetched over plain http (a token verifies: %v; log: %q)", tlsSrv.URL, plain.URL, verr == nil, log.String())
	}
	if !errors.Is(err, errRedirectToHTTP) {
		t.Fatalf("New error %q does not wrap errRedirectToHTTP", err)
	}
	for _, want := range []string{tlsSrv.URL + "/jwks.json", plain.URL + "/jwks.json"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("New error %q holds a credential", err)
	}
	// The certificate really is trusted: without the redirect New succeeds.
	tlsOK := httptest.NewUnstartedServer(plain.Config.Handler)
	tlsOK.TLS = tlsSrv.TLS
	tlsOK.StartTLS()
	defer tlsOK.Close()
	newAuth(t, Options{JWKSURL: tlsOK.URL + "/jwks.json", Now: newClock().Now})
}

// A redirect to another host is followed (identity providers move their
// key sets) but logged: the keys now come from a server the operator did
// not name.
func TestJWKSURLRedirectToOtherHostWarns(t *testing.T) {
	ec := ecKey(t, elliptic.P256())
	keys := newJWKSServer(t, jwksJSON(t, []any{&ec.PublicKey}, []string{"ec-1"}, nil))
	target := strings.Replace(keys.URL, "127.0.0.1", "localhost", 1) + "/keys.json"
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target, http.StatusFound)
	}))
	defer redirect.Close()
	var log testenv.SyncBuffer
	a := newAuth(t, Options{JWKSURL: redirect.URL + "/jwks.json", Now: newClock().Now, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	mustVerify(t, a, sign(t, jwa.ES256(), ec, "ec-1", claims(nil)))
	l := log.String()
	if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "another host") || !strings.Contains(l, target) || !strings.Contains(l, redirect.URL+"/jwks.json") {
		t.Fatalf("no warning naming both URLs of the redirect to another host:\n%s", l)
	}
}
