package main

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
	"github.com/mcpgate/mcpgate/usage"
)

// A server's shutdown ("calls in flight finish, then usage is flushed a last
// time") does not wait for a call whose client left while its own cached load
// still runs for the flight: the engine is closed (final flush, the estimate
// billed) before that call is settled on what its load reported. The gateway
// waits for such calls (gateway TestShutdownWaitsForLoadsWhoseCallersLeft).
func TestShutdownWaitsForLoadsWhoseCallersLeft(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "usage.db")
	cfg, err := policy.ParseEmbedded("sdkserver_test.yaml", []byte(`auth:
  jwt:
    hs256_secret_env: `+testSecretEnv+`
usage:
  store: sqlite:`+db+`
  flush_interval: 1h
tools:
  llm:
    cache: {ttl: 10m}
    cost: {estimate: 100, from_result: _meta.usage.tokens}
`))
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	s, err := newServer(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	started, release, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "llm"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		defer close(ended)
		close(started)
		<-release
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}},
			Meta: mcp.Meta{"usage": map[string]any{"tokens": 7}}}, nil, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() {
		err := s.serve(ctx, ln, nil)
		s.close() // as run's defer
		done <- err
	}()
	cs := connect(t, "http://"+ln.Addr().String()+"/mcp", sign(t, "bill-co", "alice", "tools:*"))
	callCtx, cancel := context.WithCancel(context.Background())
	callDone := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "llm"})
		callDone <- err
	}()
	<-started
	cancel() // the client leaves; its load runs on for the flight
	<-callDone
	time.Sleep(300 * time.Millisecond) // notifications/cancelled reaches the server
	stop()                             // SIGTERM
	go func() {
		time.Sleep(500 * time.Millisecond)
		close(release) // the load ends, reporting 7, well within the shutdown grace
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-ended
	time.Sleep(200 * time.Millisecond) // the call settles, if anything is left to settle with
	st, err := setup.OpenUsageStore(context.Background(), "sqlite:"+db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, _, err := st.Get(context.Background(), "bill-co", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Used() != 7 {
		t.Fatalf("durable usage after shutdown: used=%d calls=%d; want 7, the cost the call's own load reported (the engine was closed, and the estimate 100 flushed, before the call was settled)", rec.Used(), rec.NetCalls())
	}
}
