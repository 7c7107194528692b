//lint:file-ignore SA1019 sampling is deprecated in MCP 2026-07-28 but still served; a cached tool that samples must work.

package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// streamingUpstream is a go-sdk server (sessions, SSE answers) with tools
// that stream:
//
//	progress {ms}  a progress notification every 50ms for ms, then "done"
//	chatty         a progress notification every 20ms until cancelled
//	sample {q}     asks the client for a sampling/createMessage, returns its text
//	pinger         pings the client on the call's stream, returns pong
type streamingUpstream struct {
	url   string
	calls atomic.Int64
	sent  atomic.Int64 // progress notifications sent
}

func newStreamingUpstream(t *testing.T) *streamingUpstream {
	t.Helper()
	u := &streamingUpstream{}
	srv := sdk.NewServer(&sdk.Implementation{Name: "streaming", Version: "1"}, nil)
	end := make(chan struct{})
	every := func(ctx context.Context, req *sdk.CallToolRequest, period, d time.Duration) error {
		tick := time.NewTicker(period)
		defer tick.Stop()
		start := time.Now()
		for i := 1; d < 0 || time.Since(start) < d; i++ {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-end:
				return errors.New("test over")
			case <-tick.C:
			}
			if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
				ProgressToken: req.Params.GetProgressToken(), Progress: float64(i),
			}); err != nil {
				return err
			}
			u.sent.Add(1)
		}
		return nil
	}
	type progressIn struct {
		MS int `json:"ms"`
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "progress"}, func(ctx context.Context, req *sdk.CallToolRequest, in progressIn) (*sdk.CallToolResult, any, error) {
		u.calls.Add(1)
		if err := every(ctx, req, 50*time.Millisecond, time.Duration(in.MS)*time.Millisecond); err != nil {
			return nil, nil, err
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "done"}}}, nil, nil
	})
	sdk.AddTool(srv, &sdk.Tool{Name: "chatty"}, func(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		u.calls.Add(1)
		return nil, nil, every(ctx, req, 20*time.Millisecond, -1)
	})
	type sampleIn struct {
		Q string `json:"q"`
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "sample"}, func(ctx context.Context, req *sdk.CallToolRequest, in sampleIn) (*sdk.CallToolResult, any, error) {
		u.calls.Add(1)
		res, err := req.Session.CreateMessage(ctx, &sdk.CreateMessageParams{MaxTokens: 10, Messages: []*sdk.SamplingMessage{
			{Role: "user", Content: &sdk.TextContent{Text: in.Q}},
		}})
		if err != nil {
			return nil, nil, err
		}
		text, _ := res.Content.(*sdk.TextContent)
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "sampled: " + text.Text}}}, nil, nil
	})
	sdk.AddTool(srv, &sdk.Tool{Name: "pinger"}, func(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		u.calls.Add(1) // a keep-alive ping on the call's stream
		if err := req.Session.Ping(ctx, nil); err != nil {
			return nil, nil, err
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "pong"}}}, nil, nil
	})
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	t.Cleanup(func() { close(end) }) // first: the tools return before the server closes
	u.url = hs.URL
	return u
}

// streamingClient connects a go-sdk client that counts progress and
// answers sampling requests with "answer to <prompt>".
func streamingClient(t *testing.T, endpoint, tok string, progress *atomic.Int64) *sdk.ClientSession {
	t.Helper()
	client := sdk.NewClient(&sdk.Implementation{Name: "gateway-test", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) { progress.Add(1) },
		CreateMessageHandler: func(_ context.Context, req *sdk.CreateMessageRequest) (*sdk.CreateMessageResult, error) {
			q, _ := req.Params.Messages[0].Content.(*sdk.TextContent)
			return &sdk.CreateMessageResult{Role: "assistant", Model: "test", Content: &sdk.TextContent{Text: "answer to " + q.Text}}, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, transport(endpoint, bearer{token: tok}), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func progressCall(ctx context.Context, cs *sdk.ClientSession, tool string, args map[string]any) (*sdk.CallToolResult, error) {
	p := &sdk.CallToolParams{Name: tool, Arguments: args}
	p.SetProgressToken("p-" + tool)
	return cs.CallTool(ctx, p)
}

func resultText(res *sdk.CallToolResult) string {
	if res == nil || len(res.Content) != 1 {
		return ""
	}
	tc, _ := res.Content[0].(*sdk.TextContent)
	if tc == nil {
		return ""
	}
	return tc.Text
}

// A cached tool streams to the caller whose call loads it: progress arrives
// on a miss, and a tool that asks the client (sampling) works; a hit
// returns the stored result without the upstream.
func TestCachedToolStreams(t *testing.T) {
	t.Parallel()
	u := newStreamingUpstream(t)
	e := newEnv(t, setup{UpstreamURL: u.url, UpstreamYAML: "  timeout: 5s\n", Config: `
tools:
  progress: {cache: {ttl: 10m}}
  sample: {cache: {ttl: 10m}}
`})
	var progress atomic.Int64
	cs := streamingClient(t, e.mcpURL(0), token(t, "acme", "alice"), &progress)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	args := map[string]any{"ms": 300}
	res, err := progressCall(ctx, cs, "progress", args)
	if err != nil || resultText(res) != "done" {
		t.Fatalf("miss: %v %+v", err, res)
	}
	if progress.Load() == 0 {
		t.Fatal("no progress reached the client on a miss")
	}
	// The client runs its progress handler asynchronously: wait until every
	// notification sent has been seen before counting what the hit adds.
	for deadline := time.Now().Add(5 * time.Second); progress.Load() < u.sent.Load() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	seen := progress.Load()
	res, err = progressCall(ctx, cs, "progress", args)
	if err != nil || resultText(res) != "done" {
		t.Fatalf("hit: %v %+v", err, res)
	}
	if u.calls.Load() != 1 || progress.Load() != seen {
		t.Fatalf("hit: upstream calls %d, progress %d→%d: want the stored result, no upstream call", u.calls.Load(), seen, progress.Load())
	}

	// Sampling: the upstream's request reaches the client over the miss's
	// stream and its answer goes back; the result holds the client's
	// answer, so it is not stored, even for the tenant's own entry
	// (TestCacheElicitedTenantEntryNotStored): each call loads its own.
	for i, want := range []string{"sampled: answer to q1", "sampled: answer to q1"} {
		res, err := callTool(ctx, cs, "sample", map[string]any{"q": "q1"})
		if err != nil || resultText(res) != want {
			t.Fatalf("sample call %d: %v %+v, want %q", i, err, res, want)
		}
	}
	if got := u.calls.Load(); got != 3 {
		t.Fatalf("upstream calls %d, want 3 (one progress, two samples)", got)
	}
}

// upstream.timeout is an idle timeout (a tool streaming progress for longer
// completes) and upstream.max_duration caps a call that streams forever.
func TestUpstreamIdleTimeoutAndMaxDuration(t *testing.T) {
	t.Parallel()
	u := newStreamingUpstream(t)
	e := newEnv(t, setup{UpstreamURL: u.url, UpstreamYAML: "  timeout: 500ms\n  max_duration: 2s\n"})
	var progress atomic.Int64
	cs := streamingClient(t, e.mcpURL(0), token(t, "acme", "alice"), &progress)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := progressCall(ctx, cs, "progress", map[string]any{"ms": 1500})
	if err != nil || resultText(res) != "done" {
		t.Fatalf("1.5s of progress under a 500ms idle timeout: %v %+v", err, res)
	}
	_, err = progressCall(ctx, cs, "chatty", nil)
	// Past max_duration the stream ends with the gateway's timeout error; on
	// a starved machine the idle timeout may fire first, before the
	// upstream's first event, as a 504 ("Gateway Timeout"): both are the
	// gateway's timeout, and the call does not run forever.
	if err == nil || !strings.Contains(err.Error(), "timed out") && !strings.Contains(err.Error(), "Gateway Timeout") {
		t.Fatalf("a chatty tool past max_duration: %v, want the gateway's timeout error", err)
	}
}

// A shared cached tool (every tenant's entry) whose load asks the client
// something (sampling): the result holds the answers of the client that
// loaded it, which are not another tenant's to read, so it is not stored
// and each call loads its own (the upstream runs twice). A ping asks
// nothing the result could depend on: that entry is stored (it was not,
// and every call of every tenant ran the upstream again). A tenant's own
// entry is not stored either (TestCachedToolStreams).
func TestSharedEntryIsNotStoredFromALoadThatAskedTheClient(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tool, text string
		args       map[string]any
		calls      []int64 // the upstream's runs after each tenant's call
	}{
		{"sample", "sampled: answer to q1", map[string]any{"q": "q1"}, []int64{1, 2}},
		{"pinger", "pong", map[string]any{}, []int64{1, 1}},
	} {
		t.Run(c.tool, func(t *testing.T) {
			u := newStreamingUpstream(t)
			e := newEnv(t, setup{UpstreamURL: u.url, UpstreamYAML: "  timeout: 5s\n", Config: "tools:\n  " + c.tool + ": {cache: {ttl: 10m, shared: true}}\n"})
			var progress atomic.Int64
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i, tenant := range []string{"acme", "initech"} {
				cs := streamingClient(t, e.mcpURL(0), token(t, tenant, "alice"), &progress)
				res, err := callTool(ctx, cs, c.tool, c.args)
				if err != nil || resultText(res) != c.text {
					t.Fatalf("%s: %v %+v", tenant, err, res)
				}
				if got := u.calls.Load(); got != c.calls[i] {
					t.Fatalf("after %s's call the upstream ran %d times, want %d", tenant, got, c.calls[i])
				}
			}
		})
	}
}
