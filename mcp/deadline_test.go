package mcp

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

// timedUpstream is a go-sdk server (SSE answers, sessions) with tools whose
// timing the deadline tests need:
//
//	progress {ms}  sends a progress notification every 100ms for ms, then answers
//	silent         sends nothing until the test ends
//	chatty         sends a progress notification every 20ms until the test ends
func timedUpstream(t *testing.T) string {
	t.Helper()
	srv := sdk.NewServer(&sdk.Implementation{Name: "timed", Version: "1"}, nil)
	end := make(chan struct{})
	type progressIn struct {
		MS int `json:"ms"`
	}
	// every sends progress each period until d passed (d < 0: until the
	// test ends or the call is cancelled).
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
		}
		return nil
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "progress"}, func(ctx context.Context, req *sdk.CallToolRequest, in progressIn) (*sdk.CallToolResult, any, error) {
		if err := every(ctx, req, 100*time.Millisecond, time.Duration(in.MS)*time.Millisecond); err != nil {
			return nil, nil, err
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "done"}}}, nil, nil
	})
	sdk.AddTool(srv, &sdk.Tool{Name: "silent"}, func(ctx context.Context, _ *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		select {
		case <-ctx.Done():
		case <-end:
		}
		return nil, nil, errors.New("silent tool ended")
	})
	sdk.AddTool(srv, &sdk.Tool{Name: "chatty"}, func(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		return nil, nil, every(ctx, req, 20*time.Millisecond, -1)
	})
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	t.Cleanup(func() { close(end) }) // runs first: tools return before the server closes
	return hs.URL
}

// connectThrough opens a go-sdk client session through a test gateway over
// a Proxy with opts, counting the progress notifications it receives.
func connectThrough(t *testing.T, opts ProxyOptions, progress *atomic.Int64) (*gateway, *sdk.ClientSession) {
	t.Helper()
	g, gs := newGateway(t, opts)
	client := sdk.NewClient(&sdk.Implementation{Name: "deadline-test", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) { progress.Add(1) },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: gs.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return g, cs
}

func callWithProgress(ctx context.Context, cs *sdk.ClientSession, tool string, args map[string]any) (*sdk.CallToolResult, error) {
	p := &sdk.CallToolParams{Name: tool, Arguments: args}
	p.SetProgressToken("p-" + tool)
	return cs.CallTool(ctx, p)
}

// servedTimeout finds the Serve call that ended with a timeout.
func servedTimeout(t *testing.T, g *gateway) *served {
	t.Helper()
	for range 20 {
		s := g.next(t)
		if errors.Is(s.err, ErrUpstreamTimeout) {
			return s
		}
	}
	t.Fatal("no Serve call ended with ErrUpstreamTimeout")
	return nil
}

// Timeout is an idle timeout: a tool that keeps sending progress outlives
// it; one that goes silent does not.
func TestProxyIdleTimeout(t *testing.T) {
	up := timedUpstream(t)
	var progress atomic.Int64
	g, cs := connectThrough(t, ProxyOptions{Upstream: up, Timeout: 500 * time.Millisecond}, &progress)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	res, err := callWithProgress(ctx, cs, "progress", map[string]any{"ms": 1500})
	if err != nil || res.IsError {
		t.Fatalf("a tool sending progress for 1.5s under a 500ms idle timeout: %v %+v", err, res)
	}
	if n := progress.Load(); n < 5 {
		t.Fatalf("the client got %d progress notifications, want the tool's (about 15)", n)
	}

	_, err = callWithProgress(ctx, cs, "silent", nil)
	if err == nil || !strings.Contains(err.Error(), "Gateway Timeout") { // a 504: the SDK sends no headers before its first message
		t.Fatalf("a silent tool: %v, want the gateway's timeout error", err)
	}
	if s := servedTimeout(t, g); s.reported != 1 || !strings.Contains(string(s.rpcErr), "timed out") {
		t.Fatalf("served %+v", s)
	}
}

// MaxDuration cuts a tool that never stops streaming.
func TestProxyMaxDuration(t *testing.T) {
	up := timedUpstream(t)
	var progress atomic.Int64
	g, cs := connectThrough(t, ProxyOptions{Upstream: up, Timeout: -1, MaxDuration: 300 * time.Millisecond}, &progress)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := callWithProgress(ctx, cs, "chatty", nil)
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("a chatty tool past max duration: %v, want the gateway's timeout error", err)
	}
	s := servedTimeout(t, g)
	if !errors.Is(s.err, errMaxDuration) || s.reported != 1 {
		t.Fatalf("served %+v (err %v), want the max-duration cause", s, s.err)
	}
	if progress.Load() == 0 {
		t.Fatal("no progress reached the client before the cut")
	}
	// The session still works.
	if _, err := callWithProgress(ctx, cs, "progress", map[string]any{"ms": 0}); err != nil {
		t.Fatalf("next call: %v", err)
	}
}

func TestNewProxyDefaultsTimeout(t *testing.T) {
	p, err := NewProxy(ProxyOptions{Upstream: "http://127.0.0.1:1/mcp", MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if p.timeout != DefaultTimeout || p.maxDur != time.Minute {
		t.Fatalf("timeout %v max %v", p.timeout, p.maxDur)
	}
}
