package gateway

import (
	"context"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/federate"
)

// One tenant calls a tool of upstream a with arguments that keep it silent
// past its tools.<name>.timeout, federate.DefaultFailures times. a answers
// (a ping, at least): the timeouts are those calls' own, not failures of
// the upstream, whose circuit breaker (per upstream, shared by every
// tenant) stays closed: another tenant's call of another tool of a is
// served.
func TestOneTenantSlowCallsDoNotOpenUpstreamCircuit(t *testing.T) {
	t.Parallel()
	e := newFedEnv(t, fedSetup{Config: "tools:\n  a__slow: {timeout: 300ms}\n"})
	hostile := fedConnect(t, e.mcpURL(0), token(t, "acme", "mallory"), "2025-11-25", nil)
	for i := range federate.DefaultFailures {
		_, err := callTool(context.Background(), hostile, "a__slow", map[string]any{"ms": 5000})
		t.Logf("acme's slow call %d: %v", i+1, err)
	}
	victim := fedConnect(t, e.mcpURL(0), token(t, "globex", "bob"), "2025-11-25", nil)
	got, isErr := fedCall(t, victim, "a__echo", map[string]any{"text": "hi"})
	if isErr || strings.Contains(got, "circuit is open") {
		t.Fatalf("globex's a__echo after acme's %d timed-out calls = %q (isError %v): another tenant refused",
			federate.DefaultFailures, got, isErr)
	}
}
