package auth

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
)

// A cached token is never honoured past its exp (plus leeway), nor past
// TokenCacheTTL.
func TestVerifyCacheRespectsExpiry(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(2_000_000_000, 0)
	a, err := New(context.Background(), Options{HS256Secret: secret, Leeway: -1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := SignHS256(secret, map[string]any{"tenant_id": "t", "exp": now.Add(10 * time.Second).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second answer comes from the cache
		if _, err := a.Verify(context.Background(), tok); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(11 * time.Second)
	if _, err := a.Verify(context.Background(), tok); err == nil {
		t.Fatal("an expired token was accepted from the cache")
	}
}

func TestTokenCacheBounds(t *testing.T) {
	var c tokenCache
	now := time.Unix(0, 0)
	c.put("a", Principal{Tenant: "a"}, now.Add(time.Second))
	if p, ok := c.get("a", now); !ok || p.Tenant != "a" {
		t.Fatal("cached token not found")
	}
	if _, ok := c.get("a", now.Add(time.Second)); ok {
		t.Fatal("token served at its deadline")
	}
	for i := range TokenCacheSize + 10 {
		c.put(string(rune(i+1000)), Principal{}, now.Add(time.Hour))
	}
	if n := len(c.m); n > TokenCacheSize {
		t.Fatalf("cache holds %d tokens, bound %d", n, TokenCacheSize)
	}
}

// The cache's memory bound is TokenCacheSize tokens of at most
// MaxTokenBytes. FromRequest cuts the token out of the Authorization
// header; a cache key that kept that substring would keep the whole header
// (up to net/http's 1 MB, padded with spaces) for as long as the entry
// lives, so the cache keeps copies of its tokens.
func TestTokenCacheDoesNotPinAuthorizationHeader(t *testing.T) {
	a := newAuth(t, Options{HS256Secret: testSecret, Now: newClock().Now})
	const n, pad = 32, 256 << 10
	toks := make([]string, n)
	for i := range toks {
		toks[i] = sign(t, jwa.HS256(), testSecret, "", claims(map[string]any{"jti": fmt.Sprint(i)}))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, tok := range toks {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Header.Set("Authorization", "Bearer "+strings.Repeat(" ", pad)+tok)
		if _, err := a.FromRequest(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > int64(10*n*len(toks[0]))+(1<<20) {
		t.Fatalf("caching %d tokens of %d bytes retains %d KB of heap: the cache keys pin the headers they were cut from", n, len(toks[0]), grew>>10)
	}
	runtime.KeepAlive(a)
}
