//lint:file-ignore SA1019 sampling is deprecated in MCP 2026-07-28 but still served; the federation relays it.
package federate_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A client's upstream session (HTTP) carries two of its calls: ask (older,
// idle timeout 500ms) then hold (newer, a minute). ask's tool asks the
// client for a completion, which a person takes 1.5s to answer. A relayed
// sampling request is meant to stop the idle timeout of the call waiting
// on the client ("On the call's stream; its idle timeout waits
// meanwhile": relayRequests), but relayRequests pauses the newest call in
// flight on the session, hold, and ask's own timer runs out while its
// upstream waits on the client: ask fails with "timed out: it sent
// nothing for 500ms" although its upstream is only waiting for the answer.
func TestSamplingOfAnOlderCallPausesItsOwnIdleTimeout(t *testing.T) {
	holdStarted := make(chan struct{})
	askStarted := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	srv := mcp.NewServer(&mcp.Implementation{Name: "u", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		close(askStarted)
		select {
		case <-holdStarted:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "q"}}}})
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampled: " + res.Content.(*mcp.TextContent).Text}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "hold"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		once.Do(func() { close(holdStarted) })
		select {
		case <-release:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "held"}}}, nil, nil
	})
	url := serveSDK(t, srv)
	_, cs := start(t, federate.Options{
		Upstreams:    []federate.Upstream{{Name: "u", URL: url, Prefix: "u__", Timeout: time.Minute}},
		ToolTimeouts: map[string]time.Duration{"u__ask": 500 * time.Millisecond},
	}, &mcp.ClientOptions{
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			time.Sleep(1500 * time.Millisecond) // a person reading the request
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "ok"}}, nil
		},
	})
	t.Cleanup(func() { once.Do(func() { close(holdStarted) }) })
	defer close(release)

	type result struct {
		text  string
		isErr bool
		err   error
	}
	askDone := make(chan result, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "u__ask"})
		if err != nil {
			askDone <- result{err: err}
			return
		}
		askDone <- result{text: testenv.ToolText(res), isErr: res.IsError}
	}()
	holdDone := make(chan struct{})
	go func() {
		defer close(holdDone)
		// Sent once ask reached the upstream: hold is the newer call.
		// ask's tool waits for hold to reach the upstream before it asks.
		<-askStarted
		_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "u__hold"})
	}()
	r := <-askDone
	if r.err != nil || r.isErr || r.text != "sampled: ok" {
		t.Errorf("u__ask: text %q isError %v err %v; want \"sampled: ok\": its idle timeout ran while its upstream waited on the client", r.text, r.isErr, r.err)
	}
}
