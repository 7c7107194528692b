package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A config for an MCP server embedding the engine may leave upstream out;
// a gateway's may not, and an embedded config with an upstream section
// still needs its url. Everything else is validated as for a gateway.
func TestParseEmbedded(t *testing.T) {
	const noUpstream = "auth: {jwt: {hs256_secret_env: SECRET}}\ntiers:\n  free:\n    limits:\n      - {name: cap, per: tenant, algorithm: fixed_window, limit: 1, period: 1m}\n"
	c, err := ParseEmbedded("e.yaml", []byte(noUpstream))
	if err != nil {
		t.Fatalf("ParseEmbedded without upstream: %v", err)
	}
	if c.Upstream.URL != "" || len(c.Tiers["free"].Limits) != 1 {
		t.Fatalf("config = %+v", c)
	}
	if _, err := Parse("e.yaml", []byte(noUpstream)); err == nil || !strings.Contains(err.Error(), "e.yaml:1: upstream.url: required") {
		t.Fatalf("Parse without upstream = %v, want upstream.url required", err)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"upstream: {timeout: 1s}\n" + noUpstream, "e.yaml:1: upstream.url: required"},
		{"auth: {jwt: {}}\n", "e.yaml:1: auth.jwt: set one key source"},
		{noUpstream + "store: {on_error: sometimes}\n", "e.yaml:6: store.on_error: "},
	} {
		if _, err := ParseEmbedded("e.yaml", []byte(bad.yaml)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseEmbedded(%q) = %v, want %q", bad.yaml, err, bad.want)
		}
	}
	// cache.warm is a gateway's: an embedded config says it is ignored.
	warm := noUpstream + "tools:\n  echo: {cache: {ttl: 1m, shared: true}}\ncache:\n  warm:\n    - {tool: echo}\n"
	if c, err := ParseEmbedded("e.yaml", []byte(warm)); err != nil || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "e.yaml:9: cache.warm: ignored") {
		t.Errorf("ParseEmbedded with cache.warm = %v, warnings %q; want one warning at e.yaml:9", err, c.Warnings)
	}
	path := filepath.Join(t.TempDir(), "embedded.yaml")
	if err := os.WriteFile(path, []byte(noUpstream), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := LoadEmbedded(path); err != nil || c.Path != path {
		t.Fatalf("LoadEmbedded = %+v, %v", c, err)
	}
	if _, err := LoadEmbedded(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("LoadEmbedded of a missing file succeeded")
	}
}
