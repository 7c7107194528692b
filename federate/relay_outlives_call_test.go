//lint:file-ignore SA1019 sampling is deprecated in MCP 2026-07-28 but still served; the federation relays it.
package federate_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// askHoldServer is an upstream with two tools: ask, which waits until
// hold has reached the upstream and then asks the client for a
// completion, and hold, which waits for release (or its cancellation).
func askHoldServer(t *testing.T, release <-chan struct{}) (url string, askStarted chan struct{}) {
	holdStarted := make(chan struct{})
	askStarted = make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(holdStarted) }) })
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
	return serveSDK(t, srv), askStarted
}

// callAskThenHold calls u__ask, then u__hold once ask reached the
// upstream (hold is the newer call), and returns ask's text or error;
// holdDone is closed when hold has returned.
func callAskThenHold(cs *mcp.ClientSession, askStarted <-chan struct{}, holdDone chan<- struct{}) (string, error) {
	go func() {
		defer close(holdDone)
		<-askStarted
		_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "u__hold"})
	}()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "u__ask"})
	if err != nil {
		return "", err
	}
	if res.IsError {
		return "", errors.New(testenv.ToolText(res))
	}
	return testenv.ToolText(res), nil
}

// The older call ask's upstream asks the client for a completion; the
// relayed request travels on the newest call's stream, hold's. The client
// answers only after hold has ended: the relayed request must still be
// waiting for it, and ask gets its answer. (Once, it was sent with hold's
// request context and cancelled when hold ended, which failed ask.)
func TestRelayedRequestOutlivesTheNewerCall(t *testing.T) {
	release := make(chan struct{})
	url, askStarted := askHoldServer(t, release)
	holdDone := make(chan struct{})
	var cs *mcp.ClientSession
	ready := make(chan struct{})
	_, cs = start(t, federate.Options{
		Upstreams: []federate.Upstream{{Name: "u", URL: url, Prefix: "u__", Timeout: time.Minute}},
	}, &mcp.ClientOptions{
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			close(release)
			<-holdDone
			// A round trip through the gateway after hold's answer: the
			// gateway has finished with hold's request by then.
			<-ready
			_ = cs.Ping(ctx, nil)
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "ok"}}, nil
		},
	})
	close(ready)
	text, err := callAskThenHold(cs, askStarted, holdDone)
	if err != nil || text != "sampled: ok" {
		t.Errorf("u__ask: %q, %v; want \"sampled: ok\": the relayed request ended with the newer call", text, err)
	}
}

// A client that never answers a relayed request holds it (and the idle
// timeouts of the calls on its upstream session, paused) for RelayWait at
// most: then the upstream gets an error and the calls go on.
func TestRelayedRequestWaitsRelayWaitAtMost(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	url, askStarted := askHoldServer(t, release)
	_, cs := start(t, federate.Options{
		Upstreams: []federate.Upstream{{Name: "u", URL: url, Prefix: "u__", Timeout: time.Minute}},
		RelayWait: 200 * time.Millisecond,
	}, &mcp.ClientOptions{
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			<-ctx.Done() // never answers
			return nil, ctx.Err()
		},
	})
	holdDone := make(chan struct{})
	text, err := callAskThenHold(cs, askStarted, holdDone)
	if err == nil {
		t.Errorf("u__ask = %q; want an error: the client never answered its sampling request", text)
	}
}
