package gosdk_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/gosdk"
	"github.com/mcpgate/mcpgate/policy"
)

// A Go SDK server with the middleware, in process: a client calls a tool
// twice under a limit of one call a minute per tenant; the first call is
// admitted, the second is denied with code -33029 and the retry data.
func Example() {
	cfg, err := policy.ParseEmbedded("example.yaml", []byte(`
auth: {jwt: {hs256_secret_env: EXAMPLE_SECRET}}
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: token_bucket, limit: 1, period: 1m}
`))
	if err != nil {
		panic(err)
	}
	engine, err := enforce.New(enforce.Options{Config: cfg}) // in-process store
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	server := mcp.NewServer(&mcp.Implementation{Name: "example", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
	})
	// In process there is no bearer token: every request is acme's alice.
	// Over HTTP, gosdk.RequireBearerToken fills the default Identity.
	server.AddReceivingMiddleware(gosdk.Middleware(engine, &gosdk.Options{
		Identity: func(context.Context, mcp.Request) (gosdk.Identity, error) {
			return gosdk.Identity{Tenant: "acme", Subject: "alice"}, nil
		},
	}))

	ctx := context.Background()
	serverEnd, clientEnd := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, serverEnd, nil)
	if err != nil {
		panic(err)
	}
	defer ss.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := client.Connect(ctx, clientEnd, nil)
	if err != nil {
		panic(err)
	}
	defer cs.Close()

	for i := range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}})
		var rpcErr *jsonrpc.Error
		switch {
		case errors.As(err, &rpcErr):
			fmt.Printf("call %d: error %d: %s\n        data: %s\n", i+1, rpcErr.Code, rpcErr.Message, rpcErr.Data)
		case err != nil:
			panic(err)
		default:
			fmt.Printf("call %d: %s\n", i+1, res.Content[0].(*mcp.TextContent).Text)
		}
	}
	// Output:
	// call 1: hello
	// call 2: error -33029: rate limit exceeded (tenant rule "per_tenant"); retry in 60s
	//         data: {"scope":"tenant","rule":"per_tenant","limit":1,"remaining":0,"retry_after_seconds":60}
}
