package gateway

import (
	"strings"
	"testing"
)

// The federation's own refusal (the upstream down) is a tool error that
// says nothing of the tool: a cached tool with negative_ttl does not store
// it, so once the upstream is back no caller, of any tenant, gets it.
func TestFederationRefusalNotCached(t *testing.T) {
	e := newFedEnv(t, fedSetup{Config: "tools:\n  a__echo:\n    cache: {ttl: 10m, negative_ttl: 10m, shared: true}\n"})
	acme := fedConnect(t, e.mcpURL(0), token(t, "acme", "alice"), "2025-11-25", nil)
	e.a.stop()
	if got, isErr := fedCall(t, acme, "a__echo", map[string]any{"text": "hi"}); !isErr || !strings.Contains(got, "unavailable") {
		t.Fatalf("a__echo with a down: %q (isError %v), want the federation's refusal", got, isErr)
	}
	e.a.start()
	wantCall(t, acme, "a__echo", map[string]any{"text": "other"}, "other") // a is back
	globex := fedConnect(t, e.mcpURL(0), token(t, "globex", "bob"), "2025-11-25", nil)
	wantCall(t, globex, "a__echo", map[string]any{"text": "hi"}, "hi")
}
