package federate_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// Two client sessions (two tenants behind the gateway) subscribe to one
// resource. A's subscription is the first, so it is the one sent upstream;
// while it is in flight B subscribes and is told "subscribed" at once. A
// then gives up on its request (cancels it, or its connection drops): the
// upstream subscription goes on for B (it was sent with A's context, and B
// was left holding a subscription that never delivered an update).
func TestFirstSubscriberCancellingKeepsOthersSubscribed(t *testing.T) {
	entered := make(chan struct{}, 4)
	var held, calls atomic.Int64
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler: func(ctx context.Context, _ *mcp.SubscribeRequest) error {
			first := calls.Add(1) == 1
			entered <- struct{}{}
			if first { // the first one is slow
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(2 * time.Second):
				}
			}
			held.Add(1)
			return nil
		},
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { held.Add(-1); return nil },
	})
	up.AddResource(&mcp.Resource{URI: "test://up/doc", Name: "doc"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "doc"}}}, nil
	})
	url := serveSDK(t, up)
	_, fedURL := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "up", URL: url}}})
	a := connect(t, fedURL, newClient("tenant-a", nil))
	updates := make(chan string, 4)
	b := connect(t, fedURL, newClient("tenant-b", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) { updates <- r.Params.URI },
	}))
	const uri = "test://up/doc"

	actx, cancelA := context.WithCancel(context.Background())
	aDone := make(chan error, 1)
	go func() { aDone <- a.Subscribe(actx, &mcp.SubscribeParams{URI: uri}) }()
	select {
	case <-entered: // A's subscription is upstream, in flight
	case <-time.After(5 * time.Second):
		t.Fatal("A's subscription never reached the upstream")
	}
	if err := b.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatalf("B's subscription: %v", err)
	}
	cancelA() // A gives up on its own request
	t.Logf("A's subscribe: %v", <-aDone)
	// Give a subscription still on its way upstream time to land.
	for deadline := time.Now().Add(3 * time.Second); held.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}

	if err := up.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-updates:
		t.Logf("B got the update of %s", got)
	case <-time.After(2 * time.Second):
		t.Fatalf("B was told it is subscribed, but gets no update (upstream holds %d subscriptions): A's cancelled request took B's subscription with it", held.Load())
	}
}
