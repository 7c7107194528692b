package federate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// completion/complete reaches the upstream that owns its reference, under
// the upstream's own prompt name (the exposed one loses its prefix) or the
// resource template's URI; an unknown reference is refused.
func TestCompletionRouting(t *testing.T) {
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		CompletionHandler: func(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			ref := req.Params.Ref
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{
				Values: []string{ref.Type + " " + ref.Name + ref.URI + " " + req.Params.Argument.Name + "=" + req.Params.Argument.Value},
			}}, nil
		},
	})
	up.AddPrompt(&mcp.Prompt{Name: "greet", Arguments: []*mcp.PromptArgument{{Name: "who"}}}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{}, nil
	})
	up.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://up/items/{id}", Name: "items"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item"}}}, nil
	})
	url := serveSDK(t, up)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "up", URL: url, Prefix: "u__"}}}, nil)
	ctx := context.Background()
	complete := func(ref *mcp.CompleteReference) (string, error) {
		res, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: ref, Argument: mcp.CompleteParamsArgument{Name: "who", Value: "wo"}})
		if err != nil {
			return "", err
		}
		return strings.Join(res.Completion.Values, ","), nil
	}
	for _, tc := range []struct {
		ref  *mcp.CompleteReference
		want string
	}{
		{&mcp.CompleteReference{Type: "ref/prompt", Name: "u__greet"}, "ref/prompt greet who=wo"},
		{&mcp.CompleteReference{Type: "ref/resource", URI: "test://up/items/{id}"}, "ref/resource test://up/items/{id} who=wo"},
	} {
		got, err := complete(tc.ref)
		if err != nil || got != tc.want {
			t.Errorf("complete(%+v) = %q, %v; want %q", *tc.ref, got, err, tc.want)
		}
	}
	for _, ref := range []*mcp.CompleteReference{
		{Type: "ref/prompt", Name: "greet"}, // the upstream's name, not the exposed one
		{Type: "ref/resource", URI: "test://other/{id}"},
	} {
		if got, err := complete(ref); err == nil || !strings.Contains(err.Error(), "unknown reference") {
			t.Errorf("complete(%+v) = %q, %v; want refused as an unknown reference", *ref, got, err)
		}
	}
}
