package federate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// What one client session's subscriptions can hold, each for as long as
// the session lives (in the Federator, its SDK server and the upstream).
// One session subscribes to URIs as long as admitted, the longest first,
// then ever shorter ones once refused (the most bytes of URIs it can
// hold); another to the shortest URIs (the most subscriptions). Behind
// the gateway one tenant holds sessions.max_per_tenant (default 100)
// sessions: the test fails when those can hold more than 8 MiB of URIs
// (1,024 subscriptions of 8 KiB a session let them pin about 1 GiB of
// gateway heap) or more than 12,800 subscriptions (each costs about a
// KiB in the tables beyond its URI). Each refusal is -32602, and an
// unsubscription makes room again.
func TestSubscriptionsPinPerTenant(t *testing.T) {
	var held atomic.Int64
	up := subscribable("up", &held)
	up.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://up/items/{id}", Name: "items"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item"}}}, nil
	})
	url := serveSDK(t, up)
	_, fedURL := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "up", URL: url}}})
	ctx := context.Background()

	// fill subscribes cs to URIs padded by each of pads in turn, each as
	// long as admitted; it returns what cs then holds, and its last URI.
	fill := func(cs *mcp.ClientSession, tag string, pads ...int) (n, size int, last string) {
		t.Helper()
		for _, pad := range pads {
			for {
				uri := fmt.Sprintf("test://up/items/%s%s%05d", tag, strings.Repeat("x", pad), n)
				err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri})
				if err != nil {
					var je *jsonrpc.Error
					if !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams || !strings.Contains(je.Message, "most") {
						t.Fatalf("subscription %d (URI of %d bytes): %v, want -32602 naming the bound", n, len(uri), err)
					}
					break
				}
				n, size, last = n+1, size+len(uri), uri
			}
		}
		return n, size, last
	}
	long := connect(t, fedURL, newClient("long", nil))
	nLong, size, last := fill(long, "a", 8000, 4000, 2000, 1000, 500, 250, 100, 10, 0)
	short := connect(t, fedURL, newClient("short", nil))
	n, _, _ := fill(short, "b", 0)

	const perTenant = 100
	t.Logf("a session holds %d bytes of URIs (%d subscriptions), or %d subscriptions: a tenant's %d sessions %d KiB, or %d subscriptions",
		size, nLong, n, perTenant, size*perTenant>>10, n*perTenant)
	if size*perTenant > 8<<20 {
		t.Fatalf("one tenant's sessions can hold %d MiB of subscribed URIs under the default session caps", size*perTenant>>20)
	}
	if n*perTenant > 12_800 {
		t.Fatalf("one tenant's sessions can hold %d subscriptions under the default session caps", n*perTenant)
	}
	if got := held.Load(); got != int64(nLong+n) {
		t.Fatalf("upstream holds %d subscriptions, want %d", got, nLong+n)
	}
	if err := long.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: last}); err != nil {
		t.Fatal(err)
	}
	if err := long.Subscribe(ctx, &mcp.SubscribeParams{URI: last}); err != nil {
		t.Fatalf("subscription after an unsubscription made room: %v", err)
	}
}
