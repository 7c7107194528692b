package main

import (
	"context"
	"errors"
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

// failingListener's Accept fails, with an error net/http does not retry,
// once fail is called.
type failingListener struct {
	net.Listener
	fail chan struct{}
}

var errAcceptBroken = errors.New("accept: broken (test)")

func (l *failingListener) Accept() (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := l.Listener.Accept(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-l.fail:
		return nil, errAcceptBroken
	}
}

// When the listener fails while a call is in flight, serve returns at once
// (no srv.Shutdown, no settling.Wait) and run's deferred close stops the
// engine, whose final flush writes the call's estimate (100); the call's
// own result (7) then settles on a closed engine and is lost. On the
// signal path the shutdown waits for the call and the store holds 7.
func TestFatalServeErrorFlushesBeforeCallsInFlightSettle(t *testing.T) {
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
	started, release := make(chan struct{}), make(chan struct{})
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "llm"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		close(started)
		<-release
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}},
			Meta: mcp.Meta{"usage": map[string]any{"tokens": 7}}}, nil, nil
	})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &failingListener{Listener: inner, fail: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		err := s.serve(context.Background(), ln, nil)
		s.close() // as run's defer
		done <- err
	}()
	cs := connect(t, "http://"+inner.Addr().String()+"/mcp", sign(t, "bill-co", "alice", "tools:*"))
	callDone := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "llm"})
		callDone <- err
	}()
	<-started
	close(ln.fail)
	returned := false
	select {
	case err := <-done:
		returned = true
		t.Logf("serve returned (%v) with the call still in flight", err)
	case <-time.After(5 * time.Second):
	}
	close(release)
	<-callDone
	if !returned {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not return within 30s")
		}
	}
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
		t.Fatalf("durable usage after a fatal serve error: used=%d; want 7, the cost the call reported (the engine was closed, and the estimate flushed, before the call settled)", rec.Used())
	}
}
