package federate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// A hung upstream behind a proxy that refuses (403 with a JSON-RPC error
// body) one request between each two hung calls. A refusal is "no sign the
// upstream serves" (see throughMCP, outcome refused), yet report(refused)
// zeroed the consecutive-failure count: timeout, refusal, timeout,
// refusal, ... never reached Failures and the breaker never opened, though
// every call sent upstream timed out with its ping unanswered. A refusal
// leaves the count now.
func TestRefusalsInterleavedWithTimeoutsOpenBreaker(t *testing.T) {
	f, cs := hungBehindProxy(t, refuse403)
	timeouts := 0
	for i := range 4 {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "x"}})
		if err != nil && strings.Contains(err.Error(), "timed out") {
			timeouts++
		}
		if f.Health()[0].State == federate.StateOpen {
			return
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "forbidden"}})
		t.Logf("round %d: refused call %q %v; health %+v", i+1, callResultText(res), err, f.Health()[0])
	}
	if h := f.Health()[0]; h.State != federate.StateOpen {
		t.Errorf("health of a, hung (%d calls timed out, pings unanswered) behind a proxy refusing a request between them = %+v, want open (Failures 2)", timeouts, h)
	}
}
