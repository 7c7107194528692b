//lint:file-ignore SA1019 sampling is deprecated in MCP 2026-07-28 but still served; the federation relays it.
package federate_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A client's upstream session (HTTP) carries two of its calls: ask (older,
// idle timeout 500ms) then hold (newer, a minute). ask's tool asks the
// client for a completion, which a person takes 1.5s to answer. While the
// relayed sampling request waits on the client, ask's own idle timeout is
// paused too, not only the newest call's (hold's): ask gets its answer.
// (Once, relayRequests paused only the newest call in flight on the
// session, and ask failed with "timed out: it sent nothing for 500ms"
// although its upstream was only waiting for the answer.)
func TestSamplingOfAnOlderCallPausesItsOwnIdleTimeout(t *testing.T) {
	release := make(chan struct{})
	url, askStarted := askHoldServer(t, release)
	_, cs := start(t, federate.Options{
		Upstreams:    []federate.Upstream{{Name: "u", URL: url, Prefix: "u__", Timeout: time.Minute}},
		ToolTimeouts: map[string]time.Duration{"u__ask": 500 * time.Millisecond},
	}, &mcp.ClientOptions{
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			time.Sleep(1500 * time.Millisecond) // a person reading the request
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "ok"}}, nil
		},
	})
	defer close(release)

	text, err := callAskThenHold(cs, askStarted, make(chan struct{}))
	if err != nil || text != "sampled: ok" {
		t.Errorf("u__ask: %q, %v; want \"sampled: ok\": its idle timeout ran while its upstream waited on the client", text, err)
	}
}
