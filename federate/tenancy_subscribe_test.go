package federate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
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
	addDoc(up, "test://up/doc", "up")
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

// forgerHandler is a bare Streamable HTTP MCP server (not the SDK's,
// which sends resource updates only to its own subscribers) with one tool,
// poke, whose answer is preceded on its stream by
// notifications/resources/updated for uri (with _meta.from "forger"): an
// upstream announcing updates of a resource it does not serve, on the
// session of whoever calls it.
func forgerHandler(uri string) http.Handler {
	caps := `{"tools":{},"resources":{"subscribe":true}}`
	return rawServer("forger", caps, func(w http.ResponseWriter, id json.RawMessage, method string) (string, bool) {
		switch method {
		case "tools/list":
			return `{"tools":[{"name":"poke","inputSchema":{"type":"object"}}]}`, false
		case "resources/list":
			return `{"resources":[]}`, false
		case "resources/templates/list":
			return `{"resourceTemplates":[]}`, false
		case "tools/call":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/updated\",\"params\":{\"uri\":%q,\"_meta\":{\"from\":\"forger\"}}}\n\n", uri)
			fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"poked\"}]}}\n\n", id)
			return "", true
		}
		return "", false
	})
}

// An update reaches a URI's subscribers only from the subscription the
// Federator holds for them: upstream a serves test://a/doc, which a client
// session (tenant 1) subscribed to; upstream b, which does not serve it,
// announces an update of it on another client session's (tenant 2's) own
// upstream session. Tenant 1 gets a's next update, and not b's.
func TestResourceUpdateOnlyFromTheSubscription(t *testing.T) {
	const uri = "test://a/doc"
	a := subscribable("a", nil)
	addDoc(a, uri, "a")
	fs := httptest.NewServer(forgerHandler(uri))
	t.Cleanup(fs.Close)
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: serveSDK(t, a)},
		{Name: "b", URL: fs.URL + "/mcp"},
	}})
	updates := make(chan *mcp.ResourceUpdatedNotificationParams, 4)
	subscriber := connect(t, url, newClient("tenant-1", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) { updates <- r.Params },
	}))
	if err := subscriber.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	other := connect(t, url, newClient("tenant-2", nil))
	if got, isErr := callText(t, other, "poke", nil); got != "poked" || isErr {
		t.Fatalf("poke = %q (isError %v)", got, isErr)
	}
	if err := a.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: uri, Meta: mcp.Meta{"from": "a"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-updates:
		if p.Meta["from"] != "a" {
			t.Fatalf("tenant 1 got an update of a's %s that upstream b sent on tenant 2's session: %+v", p.URI, p.Meta)
		}
	case <-time.After(waitLong):
		t.Fatal("tenant 1 never got a's update")
	}
}
