package federate_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// A client session's subscriptions are bounded, each held in the
// Federator, the SDK and upstream for as long as the session lives: a
// resource URI over 8 KiB is refused, and so is a subscription past 1 024;
// an unsubscription makes room again. Every subscription admitted reaches
// the upstream once.
func TestSubscriptionsBounded(t *testing.T) {
	var held atomic.Int64
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { held.Add(1); return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { held.Add(-1); return nil },
	})
	up.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://up/items/{id}", Name: "items"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item"}}}, nil
	})
	url := serveSDK(t, up)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "up", URL: url}}}, nil)
	ctx := context.Background()
	item := func(id string) *mcp.SubscribeParams { return &mcp.SubscribeParams{URI: "test://up/items/" + id} }

	if err := cs.Subscribe(ctx, item(strings.Repeat("x", 9000))); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("subscription to a 9 KB URI: %v, want refused", err)
	}
	const most = 1024
	for i := range most {
		if err := cs.Subscribe(ctx, item(fmt.Sprint(i))); err != nil {
			t.Fatalf("subscription %d: %v", i, err)
		}
	}
	if err := cs.Subscribe(ctx, item("0")); err != nil {
		t.Fatalf("subscribing again to a URI held: %v", err)
	}
	if err := cs.Subscribe(ctx, item("one-more")); err == nil || !strings.Contains(err.Error(), "unsubscribe first") {
		t.Fatalf("subscription %d: %v, want refused", most+1, err)
	}
	if n := held.Load(); n != most {
		t.Fatalf("upstream holds %d subscriptions, want %d", n, most)
	}
	if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: item("0").URI}); err != nil {
		t.Fatal(err)
	}
	if err := cs.Subscribe(ctx, item("one-more")); err != nil {
		t.Fatalf("subscription after an unsubscription: %v", err)
	}
	if n := held.Load(); n != most {
		t.Fatalf("upstream holds %d subscriptions, want %d", n, most)
	}
}
