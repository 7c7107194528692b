package gosdk_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
)

// A tool that relays an mcpgate-protected upstream (or runs under a second
// Middleware) may return that upstream's denial in the deny_as: result
// form: an isError result with _meta "io.mcpgate/denial". It refuses its
// caller, for now; it is not the tool's answer, and as a negative entry it
// would reach every caller of the key (another tenant's, for a shared
// tool) until negative_ttl. It is not stored. The gateway does the same
// (gateway/cache.go, finalResult).
func TestCacheKeepsNoRelayedDenial(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, `
tools:
  relay:
    cache: {ttl: 10m, negative_ttl: 10m, shared: true}
`, options{})
	ctx := context.Background()
	a := s.connect(token(t, "tenant-a", "u"))
	res, err := call(ctx, a, "relay", map[string]any{"text": "x"})
	if err != nil || !res.IsError || res.Meta["io.mcpgate/denial"] == nil {
		t.Fatalf("tenant-a: %+v, %v; want the relayed denial", res, err)
	}
	b := s.connect(token(t, "tenant-b", "u"))
	res, err = call(ctx, b, "relay", map[string]any{"text": "x"})
	if err != nil || res.IsError || resultText(res) != "x" {
		t.Fatalf("tenant-b got %q (isError %v), %v: tenant-a's relayed denial from the cache", resultText(res), res.IsError, err)
	}
	if n := s.reached("relay"); n != 2 {
		t.Fatalf("the handler ran %d times for two tenants' calls, want 2", n)
	}
}

// A handler relaying an mcpgate-protected upstream (a gateway, or a server
// with this middleware) gets its caller's denial in the error form
// (-33029) and returns it. Under a shared cache that error, the loading
// caller's own (its tenant's limit), reaches every caller that joined the
// flight, other tenants' included, though nothing refused them. The gateway
// makes such callers run their own call (commit 9da8c56: an upstream's 429
// to one caller's cached load reached every caller of the flight); gosdk
// does so for the result form only (relayedDenial).
func TestCacheRelayedDenialErrorReachesOnlyItsCaller(t *testing.T) {
	var calls atomic.Int64
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	s := newToolServerOpts(t, `
tools:
  upstream:
    cache: {ttl: 10m, shared: true}
`, func(srv *mcp.Server) {
		srv.AddTool(&mcp.Tool{Name: "upstream", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if calls.Add(1) == 1 {
					started <- struct{}{}
					<-release
					// The upstream denied this caller (its tenant's limit).
					data, _ := json.Marshal(enforce.Denial{Scope: "tenant", Rule: "per_tenant", Limit: 10, RetryAfterSeconds: 30})
					return nil, &jsonrpc.Error{Code: enforce.CodeRateLimited, Message: "rate limit exceeded (tenant rule \"per_tenant\"); retry in 30s", Data: data}
				}
				return text("answer"), nil
			})
	}, nil, nil)
	a := s.connect(t, token(t, "tenant-a", "alice"))
	b := s.connect(t, token(t, "tenant-b", "bob"))
	ctx := context.Background()
	aDone := make(chan error, 1)
	go func() {
		_, err := call(ctx, a, "upstream", map[string]any{"q": "x"})
		aDone <- err
	}()
	<-started
	bDone := make(chan error, 1)
	go func() {
		_, err := call(ctx, b, "upstream", map[string]any{"q": "x"})
		bDone <- err
	}()
	time.Sleep(500 * time.Millisecond) // b joins a's flight
	close(release)
	if err := <-aDone; rpcError(err) == nil || rpcError(err).Code != enforce.CodeRateLimited {
		t.Fatalf("tenant-a: %v, want its own denial", err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("tenant-b, which nothing refused, got tenant-a's upstream denial: %v (handler calls: %d)", err, calls.Load())
	}
}
