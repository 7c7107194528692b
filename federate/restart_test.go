package federate_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// subUpstream is an HTTP upstream with resource subscriptions that can be
// restarted on the same address, losing every session and subscription as
// a real restart does.
type subUpstream struct {
	*httpUpstream
	subs atomic.Int64 // subscribe requests the current server received
}

func startSubUpstream(t *testing.T) *subUpstream {
	u := &subUpstream{httpUpstream: &httpUpstream{t: t, name: "up"}}
	u.build = func() *mcp.Server {
		u.subs.Store(0)
		srv := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
			SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { u.subs.Add(1); return nil },
			UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		})
		addDoc(srv, "test://up/doc", "up")
		mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
		})
		return srv
	}
	u.start()
	t.Cleanup(u.stop)
	return u
}

// An HTTP upstream restarts, losing every session: the Federator notices
// that its shared session died without waiting for a call through it. The
// subscriptions made before the restart are made again on the new shared
// session (a client still subscribed gets the restarted upstream's
// updates), and a list_changed of the restarted upstream is listed through
// it (its new tool is exposed), while the client's own calls go on.
func TestHTTPUpstreamRestart(t *testing.T) {
	const uri = "test://up/doc"
	for _, tc := range []struct {
		name string
		// before runs before the restart; after checks the upstream's
		// service once it restarted and the client's calls went through.
		before func(t *testing.T, cs *mcp.ClientSession)
		after  func(t *testing.T, up *subUpstream, cs *mcp.ClientSession, updates <-chan string)
	}{{
		name: "subscriptions are made again",
		before: func(t *testing.T, cs *mcp.ClientSession) {
			if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}); err != nil {
				t.Fatal(err)
			}
		},
		after: func(t *testing.T, up *subUpstream, cs *mcp.ClientSession, updates <-chan string) {
			testenv.Eventually(t, waitLong, "the subscription on the restarted upstream", func() bool { return up.subs.Load() == 1 })
			_ = up.server().ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: uri})
			select {
			case <-updates:
			case <-time.After(waitLong):
				t.Fatal("the client, still subscribed, got no update of the restarted upstream")
			}
		},
	}, {
		name:   "a list_changed lists it again",
		before: func(*testing.T, *mcp.ClientSession) {},
		after: func(t *testing.T, up *subUpstream, cs *mcp.ClientSession, _ <-chan string) {
			mcp.AddTool(up.server(), &mcp.Tool{Name: "late"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late"}}}, nil, nil
			})
			testenv.Eventually(t, waitLong, "up__late to be listed", func() bool {
				for tool, err := range cs.Tools(context.Background(), nil) {
					if err == nil && tool.Name == "up__late" {
						return true
					}
				}
				return false
			})
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			up := startSubUpstream(t)
			_, fedURL := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "up", URL: up.URL(), Prefix: "up__"}}})
			updates := make(chan string, 16)
			cs := connect(t, fedURL, newClient("tenant-a", &mcp.ClientOptions{
				ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) { updates <- r.Params.URI },
			}))
			tc.before(t, cs)
			up.stop()
			up.start()
			// The client's own session is opened again (a first call may
			// meet a pooled connection of the stopped server).
			testenv.Eventually(t, waitLong, "a call after the restart to go through", func() bool {
				got, isErr := callText(t, cs, "up__echo", map[string]any{"text": "x"})
				return got == "x" && !isErr
			})
			tc.after(t, up, cs, updates)
		})
	}
}
