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

// A monthly quota of 10 units, charged with the tenant's rate limit in one
// atomic step. After a restart the meter is gone: the first call asks for
// the durable total (NeedSeed), and the call is made again with it.
func ExampleStore_TakeMetered() {
	clock := limittest.NewFakeClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	store, err := memstore.New(&memstore.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	ctx := context.Background()
	checks := []limit.Check{{Rule: limit.Rule{Name: "per_tenant", Algorithm: limit.TokenBucket, Limit: 100, Period: time.Minute}, Key: "rl:acme"}}
	meter := limit.Meter{
		Key: "usage:acme:2025-06", Tenant: "acme", Period: "2025-06", Quota: 10,
		ExpireAt: time.Date(2025, 7, 8, 0, 0, 0, 0, time.UTC), // end of the period plus a week of grace
	}
	_, mr, err := store.TakeMetered(ctx, checks, meter, 4)
	if err != nil {
		panic(err)
	}
	fmt.Printf("need seed=%v\n", mr.NeedSeed)
	meter.Seed, meter.Seeded = limit.Usage{Charged: 5, Calls: 2}, true // from the durable store
	for _, cost := range []int64{4, 2, 1} {
		d, mr, err := store.TakeMetered(ctx, checks, meter, cost)
		if err != nil {
			panic(err)
		}
		fmt.Printf("cost %d: allowed=%v used=%d calls=%d\n", cost, d.Allowed, mr.Usage.Used(), mr.Usage.Calls)
	}
	// Output:
	// need seed=true
	// cost 4: allowed=true used=9 calls=3
	// cost 2: allowed=false used=9 calls=3
	// cost 1: allowed=true used=10 calls=4
}
