package enforce_test

import (
	"context"
	"fmt"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// An engine on its in-process store: two calls pass a per-tenant limit of
// two per minute (a bucket of two refilled one per 30s), the third is denied with the data a client can act on,
// and another tenant is counted apart.
func Example() {
	cfg, err := policy.Parse("example.yaml", []byte(`
upstream: {url: "http://127.0.0.1:9000/mcp"}
auth: {jwt: {hs256_secret_env: EXAMPLE_SECRET}}
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: token_bucket, limit: 2, period: 1m}
`))
	if err != nil {
		panic(err)
	}
	engine, err := enforce.New(enforce.Options{Config: cfg})
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	ctx := context.Background()
	call := enforce.Call{Tenant: "acme", Subject: "alice", Name: "search", Arguments: []byte(`{"q":"mcp"}`)}
	for i := range 3 {
		ticket, d := engine.Admit(ctx, call)
		if !d.Allowed {
			fmt.Printf("call %d: denied: %+v\n", i+1, d.Denial())
			continue
		}
		fmt.Printf("call %d: admitted, %d left\n", i+1, d.Limit.Remaining)
		// ... run the tool, then settle the call:
		ticket.Done(ctx, enforce.Outcome{Status: enforce.OK})
	}
	other, d := engine.Admit(ctx, enforce.Call{Tenant: "globex", Subject: "bob", Name: "search"})
	defer other.Done(ctx, enforce.Outcome{})
	fmt.Println("another tenant admitted:", d.Allowed)
	// Output:
	// call 1: admitted, 1 left
	// call 2: admitted, 0 left
	// call 3: denied: {Scope:tenant Rule:per_tenant Limit:2 Remaining:0 RetryAfterSeconds:30}
	// another tenant admitted: true
}
