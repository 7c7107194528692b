//lint:file-ignore SA1019 roots are deprecated in MCP 2026-07-28 but still served; the federation relays them.
package federate_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// rootsUpstream serves an upstream whose tool caps reports the roots
// capability its client declared (nil: none), and which lists its
// client's roots again on every notifications/roots/list_changed, sending
// their URIs to heard; it returns its URL.
func rootsUpstream(t *testing.T, declared chan<- *mcp.RootCapabilities, heard chan<- []string) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "r", Version: "1"}, &mcp.ServerOptions{
		RootsListChangedHandler: func(_ context.Context, req *mcp.RootsListChangedRequest) {
			go func() {
				var uris []string
				res, err := req.Session.ListRoots(context.Background(), nil)
				if err != nil {
					uris = []string{"error: " + err.Error()}
				} else {
					for _, r := range res.Roots {
						uris = append(uris, r.URI)
					}
				}
				heard <- uris
			}()
		},
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "caps"}, func(ctx context.Context, req *mcp.CallToolRequest, _ textArgs) (*mcp.CallToolResult, any, error) {
		declared <- req.Session.InitializeParams().Capabilities.RootsV2
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	return serveSDK(t, srv)
}

// The federation tells an HTTP upstream, on a client's own session, that
// the client supports roots with listChanged (its capability): an upstream
// relying on that (it keeps the roots, and lists them again on
// notifications/roots/list_changed) hears the client's notification, or
// its roots would stay stale; and the roots it then lists are the
// client's.
func TestRootsListChangedReachesTheUpstream(t *testing.T) {
	declared, heard := make(chan *mcp.RootCapabilities, 4), make(chan []string, 4)
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "r", URL: rootsUpstream(t, declared, heard), Prefix: "r__"}}})
	client := newClient("tenant-a", nil) // the SDK's default: roots with listChanged
	client.AddRoots(&mcp.Root{URI: "file:///one"})
	cs := connect(t, url, client)
	// The client's own upstream session is opened by its first call.
	if got, isErr := callText(t, cs, "r__caps", nil); got != "ok" || isErr {
		t.Fatalf("r__caps = %q %v", got, isErr)
	}
	if roots := <-declared; roots == nil || !roots.ListChanged {
		t.Fatalf("roots declared upstream: %+v, want listChanged", roots)
	}
	client.AddRoots(&mcp.Root{URI: "file:///two"}) // sends notifications/roots/list_changed
	select {
	case uris := <-heard:
		slices.Sort(uris)
		if want := []string{"file:///one", "file:///two"}; !slices.Equal(uris, want) {
			t.Errorf("the upstream's roots/list after the change: %v, want the client's %v", uris, want)
		}
	case <-time.After(waitLong):
		t.Fatal("the upstream never heard notifications/roots/list_changed: its roots stay stale")
	}
}

// A client that declared no roots capability is declared upstream without
// one: the upstream must not ask it for roots, nor wait for their changes.
func TestNoRootsCapabilityIsDeclaredUpstreamWithout(t *testing.T) {
	declared, heard := make(chan *mcp.RootCapabilities, 4), make(chan []string, 4)
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "r", URL: rootsUpstream(t, declared, heard), Prefix: "r__"}}})
	cs := connect(t, url, newClient("tenant-a", &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}))
	if got, isErr := callText(t, cs, "r__caps", nil); got != "ok" || isErr {
		t.Fatalf("r__caps = %q %v", got, isErr)
	}
	if roots := <-declared; roots != nil {
		t.Errorf("roots declared upstream for a client without roots: %+v", roots)
	}
}
