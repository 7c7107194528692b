package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/limittest"
	"github.com/mcpgate/mcpgate/limit/memstore"
)

// Two rules on one request: a tenant may make 5 calls a minute, and 2 calls
// a minute to one tool. The third call to the tool is denied by the tool
// rule, and the tenant rule is not charged for it.
func Example() {
	// A fake clock makes the output reproducible; pass nil Options in
	// production for the real clock.
	clock := limittest.NewFakeClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	store, err := memstore.New(&memstore.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	checks := []limit.Check{
		{Rule: limit.Rule{Name: "per_tenant", Algorithm: limit.TokenBucket, Limit: 5, Period: time.Minute}, Key: "tenant:acme"},
		{Rule: limit.Rule{Name: "per_tool", Algorithm: limit.SlidingWindow, Limit: 2, Period: time.Minute}, Key: "tenant:acme:tool:search"},
	}
	for range 3 {
		d, err := store.Take(context.Background(), checks, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v rule=%s remaining=%d retry_after=%v\n", d.Allowed, d.Rule.Name, d.Remaining, d.RetryAfter)
	}
	// A call to another tool meets the tenant rule alone: 3 of 5 are left,
	// the denied call took none.
	d, err := store.Take(context.Background(), checks[:1], 1)
	if err != nil {
		panic(err)
	}
	fmt.Printf("allowed=%v rule=%s remaining=%d\n", d.Allowed, d.Rule.Name, d.Remaining)
	// Output:
	// allowed=true rule=per_tool remaining=1 retry_after=0s
	// allowed=true rule=per_tool remaining=0 retry_after=0s
	// allowed=false rule=per_tool remaining=0 retry_after=1m0s
	// allowed=true rule=per_tenant remaining=2
}
