package federate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// A client session's subscriptions are bounded, each held in the
// Federator, the SDK and upstream for as long as the session lives: a
// resource URI over 2 KiB is refused, and so is a subscription past 128;
// an unsubscription makes room again. Every subscription admitted reaches
// the upstream once.
func TestSubscriptionsBounded(t *testing.T) {
	var held atomic.Int64
	up := subscribable("up", &held)
	up.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://up/items/{id}", Name: "items"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item"}}}, nil
	})
	url := serveSDK(t, up)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "up", URL: url}}}, nil)
	ctx := context.Background()
	item := func(id string) *mcp.SubscribeParams { return &mcp.SubscribeParams{URI: "test://up/items/" + id} }

	if err := cs.Subscribe(ctx, item(strings.Repeat("x", 2100))); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("subscription to a 2.1 KB URI: %v, want refused", err)
	}
	const most = 128
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

// subscribable is an upstream named name that accepts subscriptions,
// counting in held (nil: not counted) those it holds.
func subscribable(name string, held *atomic.Int64) *mcp.Server {
	count := func(d int64) {
		if held != nil {
			held.Add(d)
		}
	}
	return mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { count(1); return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { count(-1); return nil },
	})
}

// gatedSubscriptions is an upstream serving test://up/doc whose subscribe
// (when holdSub) or unsubscribe (when holdUnsub) handler, the first time
// it runs, tells entered and waits for release; a held subscribe then
// fails. held counts the subscriptions the upstream holds.
type gatedSubscriptions struct {
	srv                *mcp.Server
	entered, release   chan struct{}
	held, subs, unsubs atomic.Int64
	holdSub, holdUnsub bool
	heldOnce           atomic.Bool
}

func newGatedSubscriptions(holdSub, holdUnsub bool) *gatedSubscriptions {
	g := &gatedSubscriptions{entered: make(chan struct{}), release: make(chan struct{}), holdSub: holdSub, holdUnsub: holdUnsub}
	hold := func() bool {
		if g.heldOnce.Swap(true) {
			return false
		}
		close(g.entered)
		<-g.release
		return true
	}
	g.srv = mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler: func(context.Context, *mcp.SubscribeRequest) error {
			g.subs.Add(1)
			if g.holdSub && hold() {
				return errors.New("try again later")
			}
			g.held.Add(1)
			return nil
		},
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error {
			g.unsubs.Add(1)
			if g.holdUnsub {
				hold()
			}
			g.held.Add(-1)
			return nil
		},
	})
	addDoc(g.srv, "test://up/doc", "up")
	return g
}

// Clients subscribe to one URI while the upstream request of another is
// in flight (held here until the others joined); each is told
// "subscribed" only when the upstream holds the subscription, and then
// gets its updates.
//
// A subscription that fails upstream fails for every client that joined
// it (none is left "subscribed" with nothing upstream, keeping the next
// client from subscribing again); a subscription that joins while the
// unsubscription of the last client to leave is in flight is sent after
// it (not overtaken by it, which would leave the upstream unsubscribed).
func TestSubscriptionsJoiningARequestInFlight(t *testing.T) {
	const uri = "test://up/doc"
	subscribe := func(cs *mcp.ClientSession) <-chan error {
		done := make(chan error, 1)
		go func() { done <- cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}) }()
		return done
	}
	for _, tc := range []struct {
		name               string
		holdSub, holdUnsub bool
	}{
		{name: "the first subscription fails", holdSub: true},
		{name: "the last unsubscription is in flight", holdUnsub: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGatedSubscriptions(tc.holdSub, tc.holdUnsub)
			f, fedURL := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "up", URL: serveSDK(t, g.srv)}}})
			updates := make(chan string, 8)
			onUpdate := &mcp.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) { updates <- r.Params.URI }}
			a := connect(t, fedURL, newClient("tenant-a", nil))
			b := connect(t, fedURL, newClient("tenant-b", onUpdate))

			var aDone <-chan error
			if tc.holdUnsub {
				if err := <-subscribe(a); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- a.Unsubscribe(context.Background(), &mcp.UnsubscribeParams{URI: uri}) }()
				aDone = done
			} else {
				aDone = subscribe(a)
			}
			<-g.entered // a's upstream request is held
			bDone := subscribe(b)
			want := 2 // a subscribing, b joining
			if tc.holdUnsub {
				want = 1 // a left
			}
			testenv.Eventually(t, waitLong, "b to join", func() bool { return federate.Subscribers(f, uri) == want })
			close(g.release)
			errA, errB := <-aDone, <-bDone
			t.Logf("a: %v; b: %v", errA, errB)
			if tc.holdSub && (errA == nil || errB == nil) {
				t.Fatalf("a and b joined a subscription the upstream refused, and were told %v and %v; want its error for both", errA, errB)
			}
			if tc.holdSub { // after the failure, a client subscribing now is served
				c := connect(t, fedURL, newClient("tenant-c", onUpdate))
				if err := <-subscribe(c); err != nil {
					t.Fatal(err)
				}
			} else if errB != nil {
				t.Fatalf("b: %v", errB)
			}
			if n := g.held.Load(); n != 1 {
				t.Fatalf("the upstream holds %d subscriptions (%d subscribe and %d unsubscribe requests), want 1", n, g.subs.Load(), g.unsubs.Load())
			}
			_ = g.srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: uri})
			select {
			case <-updates:
			case <-time.After(waitLong):
				t.Fatal("the subscribed client got no update")
			}
		})
	}
}

// An unsubscription leaves the session's subscription of the URI
// whichever upstream it was made on, though the URI's upstream changed
// since: the resource is gone, or an upstream earlier in configuration
// order now lists it. Neither the Federator nor the upstream keeps it.
func TestUnsubscribeAfterTheURIsUpstreamChanged(t *testing.T) {
	const uri = "test://shared/doc"
	for _, c := range []struct {
		name   string
		change func(first, second *mcp.Server) // first was empty, second lists uri
		reads  string                          // what a read of uri then answers ("": it is not listed)
	}{
		{"the resource went", func(_, second *mcp.Server) { second.RemoveResources(uri) }, ""},
		{"an earlier upstream lists it", func(first, _ *mcp.Server) { addDoc(first, uri, "first") }, "doc of first"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var held atomic.Int64
			first := subscribable("first", nil)
			addDoc(first, "test://first/other", "first")
			second := subscribable("second", &held)
			addDoc(second, uri, "second")
			f, cs := start(t, federate.Options{Upstreams: []federate.Upstream{
				{Name: "first", URL: serveSDK(t, first)}, {Name: "second", URL: serveSDK(t, second)},
			}}, nil)
			ctx := context.Background()
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
				t.Fatal(err)
			}
			if n, h := federate.Subscribers(f, uri), held.Load(); n != 1 || h != 1 {
				t.Fatalf("subscribed: the Federator holds %d subscribers, second %d subscriptions; want 1 and 1", n, h)
			}
			c.change(first, second)
			testenv.Eventually(t, waitLong, "the federation to list the change", func() bool {
				if c.reads == "" {
					res, err := cs.ListResources(ctx, nil)
					return err == nil && !slices.ContainsFunc(res.Resources, func(r *mcp.Resource) bool { return r.URI == uri })
				}
				res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
				return err == nil && len(res.Contents) == 1 && res.Contents[0].Text == c.reads
			})
			if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, waitLong, "the subscription to be left", func() bool {
				return federate.Subscribers(f, uri) == 0 && held.Load() == 0
			})
		})
	}
}
