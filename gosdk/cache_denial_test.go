package gosdk_test

import (
	"context"
	"testing"
)

// A tool that relays an mcpgate-protected upstream (or runs under a second
// Middleware) may return that upstream's denial in the deny_as: result
// form: an isError result with _meta "io.mcpgate/denial". It refuses its
// caller, for now; it is not the tool's answer, and as a negative entry it
// would reach every caller of the key (another tenant's, for a shared
// tool) until negative_ttl. It is not stored. The gateway does the same
// (gateway/cache.go, finalResult).
func TestCacheKeepsNoRelayedDenial(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, `
tools:
  relay:
    cache: {ttl: 10m, negative_ttl: 10m, shared: true}
`, options{})
	ctx := context.Background()
	a := s.connect(token(t, "tenant-a", "u"))
	res, err := call(ctx, a, "relay", map[string]any{"text": "x"})
	if err != nil || !res.IsError || res.Meta["io.mcpgate/denial"] == nil {
		t.Fatalf("tenant-a: %+v, %v; want the relayed denial", res, err)
	}
	b := s.connect(token(t, "tenant-b", "u"))
	res, err = call(ctx, b, "relay", map[string]any{"text": "x"})
	if err != nil || res.IsError || resultText(res) != "x" {
		t.Fatalf("tenant-b got %q (isError %v), %v: tenant-a's relayed denial from the cache", resultText(res), res.IsError, err)
	}
	if n := s.reached("relay"); n != 2 {
		t.Fatalf("the handler ran %d times for two tenants' calls, want 2", n)
	}
}
