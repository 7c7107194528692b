package gosdk_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/gosdk"
	"github.com/mcpgate/mcpgate/policy"
)

// recoverer is an outer receiving middleware that turns a handler's panic
// into a JSON-RPC internal error (the usual way to keep one bad tool from
// killing an SDK server, which recovers nothing itself).
func recoverer(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (res mcp.Result, err error) {
		defer func() {
			if r := recover(); r != nil {
				res, err = nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprint("panic: ", r)}
			}
		}()
		return next(ctx, method, req)
	}
}

// toolCall does not settle (Ticket.Done) a call whose handler
// panics: Done is not deferred (request() defers it). Behind a recovering
// middleware, the call's concurrency slot stays taken until its lease runs
// out (the rule's period): every later call of the tool is refused.
// The cached path is settled (the cache recovers the loader's panic).
func TestPanickingToolFreesItsSlot(t *testing.T) {
	cfg, err := policy.ParseEmbedded("p.yaml", []byte("auth:\n  jwt:\n    hs256_secret_env: "+testSecretEnv+"\n"+`
tools:
  boom:
    limits:
      - {name: one_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 1, period: 10m}
`))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := enforce.New(enforce.Options{Config: cfg, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	srv := mcp.NewServer(&mcp.Implementation{Name: "p", Version: "1"}, nil)
	first := true
	mcp.AddTool(srv, &mcp.Tool{Name: "boom"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		if first {
			first = false
			panic("tool bug")
		}
		return text("ok"), nil, nil
	})
	id := func(context.Context, mcp.Request) (gosdk.Identity, error) {
		return gosdk.Identity{Tenant: "acme", Subject: "alice"}, nil
	}
	srv.AddReceivingMiddleware(recoverer, gosdk.Middleware(eng, &gosdk.Options{Identity: id}))
	ct, st := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	_, err = call(ctx, cs, "boom", nil)
	if e := rpcError(err); e == nil || e.Code != jsonrpc.CodeInternalError {
		t.Fatalf("first call: %v, want the recoverer's internal error", err)
	}
	// The first call has ended: the next one must find the slot free.
	res, err := call(ctx, cs, "boom", nil)
	if err != nil {
		t.Fatalf("second call, after the first ended in a panic: %v (the panicked call's concurrency slot was never released)", err)
	}
	if resultText(res) != "ok" {
		t.Fatalf("second call: %+v", res)
	}
}
