package auth

import (
	"context"
	"testing"
	"time"
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
