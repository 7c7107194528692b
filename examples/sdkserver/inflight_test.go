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

// blockingLLM is a server whose tool "llm" (config: llm, its YAML lines
// under "llm:", with cost estimate 100 taken from _meta.usage.tokens)
// blocks until release is closed, then reports 7 tokens; started is
// closed when it is called, ended when it returns. Usage goes to the
// SQLite store at db, flushed hourly (so only the final flush writes it).
type blockingLLM struct {
	s                       *server
	db                      string
	started, release, ended chan struct{}
}

func newBlockingLLM(t *testing.T, llm string) *blockingLLM {
	t.Helper()
	db := filepath.Join(t.TempDir(), "usage.db")
	cfg, err := policy.ParseEmbedded("sdkserver_test.yaml", []byte(`auth:
  jwt:
    hs256_secret_env: `+testSecretEnv+`
usage:
  store: sqlite:`+db+`
  flush_interval: 1h
tools:
  llm:
`+llm+`    cost: {estimate: 100, from_result: _meta.usage.tokens}
`))
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	s, err := newServer(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	b := &blockingLLM{s: s, db: db, started: make(chan struct{}), release: make(chan struct{}), ended: make(chan struct{})}
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "llm"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		defer close(b.ended)
		close(b.started)
		<-b.release
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}},
			Meta: mcp.Meta{"usage": map[string]any{"tokens": 7}}}, nil, nil
	})
	return b
}

// serveAndCall serves b's server on ln until ctx ends, closing it after (as
// run's defer), and calls llm through addr as bill-co with callCtx. done
// has serve's error once the server is closed, callDone the call's.
func (b *blockingLLM) serveAndCall(t *testing.T, ctx context.Context, ln net.Listener, addr string, callCtx context.Context) (done, callDone <-chan error) {
	t.Helper()
	served := make(chan error, 1)
	go func() {
		err := b.s.serve(ctx, ln, nil)
		b.s.close() // as run's defer
		served <- err
	}()
	cs := connect(t, "http://"+addr+"/mcp", sign(t, "bill-co", "alice", "tools:*"))
	called := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "llm"})
		called <- err
	}()
	return served, called
}

// durableUsage is bill-co's usage record of this period in the store at db.
func durableUsage(t *testing.T, db string) usage.Record {
	t.Helper()
	st, err := setup.OpenUsageStore(context.Background(), "sqlite:"+db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, _, err := st.Get(context.Background(), "bill-co", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
