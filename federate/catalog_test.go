package federate_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// addDoc makes s list test://shared/doc, whose text names s.
func addDoc(s *mcp.Server, name string) {
	s.AddResource(&mcp.Resource{URI: "test://shared/doc", Name: "doc"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "doc of " + name}}}, nil
	})
}

// A URI two upstreams list belongs to the first in configuration order,
// whatever the order their listings change in: when the first stops
// listing it, the second serves it; when the first lists it again
// (after the second's listing changed meanwhile), the first serves it
// again.
func TestSharedResourceFollowsConfigurationOrder(t *testing.T) {
	a, b := mcp.NewServer(&mcp.Implementation{Name: "a", Version: "1"}, nil), mcp.NewServer(&mcp.Implementation{Name: "b", Version: "1"}, nil)
	addDoc(a, "a")
	addDoc(b, "b")
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: serveSDK(t, a)}, {Name: "b", URL: serveSDK(t, b)}}}, nil)
	readsFrom := func(want string) func() bool {
		return func() bool {
			res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "test://shared/doc"})
			return err == nil && len(res.Contents) == 1 && res.Contents[0].Text == "doc of "+want
		}
	}
	testenv.Eventually(t, waitLong, "reads from a", readsFrom("a"))
	a.RemoveResources("test://shared/doc")
	testenv.Eventually(t, waitLong, "reads from b once a no longer lists it", readsFrom("b"))
	b.AddResource(&mcp.Resource{URI: "test://b/other", Name: "other"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "other"}}}, nil
	})
	testenv.Eventually(t, waitLong, "b's new listing", func() bool {
		_, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "test://b/other"})
		return err == nil
	})
	addDoc(a, "a")
	testenv.Eventually(t, waitLong, "reads from a once it lists it again", readsFrom("a"))
}
