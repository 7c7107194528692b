package limit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/limittest"
	"github.com/mcpgate/mcpgate/limit/memstore"
)

// newStore returns an in-process store on a fake clock, so that the outputs
// below are reproducible; in production pass nil Options (the real clock), or
// use the Redis store, which decides the same.
func newStore() (*memstore.Store, *limittest.FakeClock) {
	clock := limittest.NewFakeClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	store, err := memstore.New(&memstore.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	return store, clock
}

// check builds a Check whose key is the rule's counter for owner.
func check(per keyspace.Per, r limit.Rule, o keyspace.Owner) limit.Check {
	return limit.Check{Rule: r, Key: keyspace.Counter(per, string(r.Algorithm), r.Name, o)}
}

// Three layers of limits on one call: the tenant, the agent (subject) and
// the tenant's use of one tool. The batch is decided atomically: when the
// tool rule denies the fourth call, the tenant and agent rules are not
// charged for it either, as the next call, to another tool, shows. A cost
// larger than a rule's capacity can never fit.
func Example() {
	store, _ := newStore()
	defer store.Close()
	ctx := context.Background()

	tenant := limit.Rule{Name: "tenant", Algorithm: limit.TokenBucket, Limit: 100, Period: time.Minute, Burst: 20}
	agent := limit.Rule{Name: "agent", Algorithm: limit.SlidingWindowCounter, Limit: 10, Period: time.Minute}
	tool := limit.Rule{Name: "per_tool", Algorithm: limit.FixedWindow, Limit: 3, Period: time.Minute}
	checksFor := func(name string) []limit.Check {
		o := keyspace.Owner{Tenant: "acme", Subject: "agent-7", Tool: name}
		return []limit.Check{
			check(keyspace.PerTenant, tenant, o),
			check(keyspace.PerSubject, agent, o),
			check(keyspace.PerTenantTool, tool, o),
		}
	}
	take := func(checks []limit.Check, cost int64) limit.Decision {
		d, err := store.Take(ctx, checks, cost)
		if err != nil {
			panic(err)
		}
		return d
	}

	search := checksFor("search")
	for call := 1; call <= 4; call++ {
		d := take(search, 1)
		fmt.Printf("search %d: allowed=%v rule=%s remaining=%d retry_after=%v\n",
			call, d.Allowed, d.Rule.Name, d.Remaining, d.RetryAfter)
	}

	d := take(checksFor("fetch"), 1)
	fmt.Printf("fetch: allowed=%v tenant remaining=%d agent remaining=%d\n",
		d.Allowed, d.Results[0].Remaining, d.Results[1].Remaining)

	d = take(checksFor("fetch"), 50) // the tenant's burst is 20
	fmt.Println("cost 50: allowed:", d.Allowed, "never:", d.RetryAfter == limit.Never)
	// Output:
	// search 1: allowed=true rule=per_tool remaining=2 retry_after=0s
	// search 2: allowed=true rule=per_tool remaining=1 retry_after=0s
	// search 3: allowed=true rule=per_tool remaining=0 retry_after=0s
	// search 4: allowed=false rule=per_tool remaining=0 retry_after=1m0s
	// fetch: allowed=true tenant remaining=16 agent remaining=6
	// cost 50: allowed: false never: true
}

// A shadow rule is evaluated and reported, never enforced: it shows what a
// stricter limit would do before it is switched on.
func ExampleRule_shadow() {
	store, _ := newStore()
	defer store.Close()

	o := keyspace.Owner{Tenant: "acme"}
	checks := []limit.Check{
		check(keyspace.PerTenant, limit.Rule{Name: "current", Algorithm: limit.GCRA, Limit: 10, Period: time.Minute}, o),
		check(keyspace.PerTenant, limit.Rule{Name: "proposed", Algorithm: limit.GCRA, Limit: 1, Period: time.Minute, Shadow: true}, o),
	}
	for range 2 {
		d, err := store.Take(context.Background(), checks, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v rule=%s proposed would allow=%v\n", d.Allowed, d.Rule.Name, d.Results[1].Allowed)
	}
	// Output:
	// allowed=true rule=current proposed would allow=true
	// allowed=true rule=current proposed would allow=false
}

// Rules come from configuration: Validate rejects those no store can
// evaluate exactly.
func ExampleRule_Validate() {
	r := limit.Rule{Name: "tenant", Algorithm: limit.TokenBucket, Limit: 0, Period: time.Second}
	fmt.Println(errors.Is(r.Validate(), limit.ErrInvalidRule))
	r.Limit = 10
	fmt.Println(r.Validate(), r.Capacity())
	// Output:
	// true
	// <nil> 10
}

// A concurrency rule caps the calls in flight, for long-running tools. Each
// admitted call holds a slot under its Decision's lease until Release; the
// slot of a holder that died (and never releases) frees itself when its
// lease, the rule's Period, runs out.
func ExampleStore_Release() {
	store, clock := newStore()
	defer store.Close()
	ctx := context.Background()

	o := keyspace.Owner{Tenant: "acme", Tool: "render"}
	checks := []limit.Check{
		check(keyspace.PerTenantTool, limit.Rule{Name: "render", Algorithm: limit.Concurrency, Limit: 1, Period: 5 * time.Minute}, o),
	}
	take := func() limit.Decision {
		d, err := store.Take(ctx, checks, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v lease=%v retry_after=%v\n", d.Allowed, d.Lease != "", d.RetryAfter)
		return d
	}

	d := take()
	// ... the call runs, then ends:
	if err := store.Release(ctx, checks, d.Lease); err != nil {
		panic(err)
	}
	take() // this holder never releases: its process died
	take()
	clock.Advance(5 * time.Minute)
	take()
	// Output:
	// allowed=true lease=true retry_after=0s
	// allowed=true lease=true retry_after=0s
	// allowed=false lease=false retry_after=1s
	// allowed=true lease=true retry_after=0s
}

// A meter counts a tenant's usage in a billing period, charged in the same
// atomic step as the rate limits. Here the rule counts calls (cost 1) while
// the meter charges the tokens a call is estimated to use (Meter.Cost),
// against a monthly quota; the estimate is corrected once the tool reports
// what it really used. A call denied by the quota alone has no deciding rule:
// the quota resets at the end of the period, which the caller knows.
func ExampleMeter() {
	store, _ := newStore()
	defer store.Close()
	ctx := context.Background()

	period := "2025-06"
	checks := []limit.Check{
		check(keyspace.PerTenant, limit.Rule{Name: "tenant", Algorithm: limit.TokenBucket, Limit: 60, Period: time.Minute}, keyspace.Owner{Tenant: "acme"}),
	}
	m := limit.Meter{
		Key: keyspace.Usage("acme", period), Tenant: "acme", Period: period,
		Quota:    1000,
		Seed:     limit.Usage{}, // the durable total of the period: nothing yet
		Seeded:   true,
		ExpireAt: time.Date(2025, 7, 8, 0, 0, 0, 0, time.UTC), // end of the period plus a week to flush
	}
	for _, estimate := range []int64{400, 400, 800} {
		m.Cost = estimate
		d, mr, err := store.TakeMetered(ctx, checks, m, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("estimate %d: allowed=%v rule=%q used=%d calls=%d\n",
			estimate, d.Allowed, d.Rule.Name, mr.Usage.Used(), mr.Usage.Calls)
		if !d.Allowed {
			continue
		}
		// The tool reported 150 tokens: refund the rest of the estimate.
		mr, err = store.Adjust(ctx, m, limit.Usage{Refunded: estimate - 150})
		if err != nil {
			panic(err)
		}
		fmt.Printf("  corrected: used=%d charged=%d refunded=%d\n", mr.Usage.Used(), mr.Usage.Charged, mr.Usage.Refunded)
	}
	// Output:
	// estimate 400: allowed=true rule="tenant" used=400 calls=1
	//   corrected: used=150 charged=400 refunded=250
	// estimate 400: allowed=true rule="tenant" used=550 calls=2
	//   corrected: used=300 charged=800 refunded=500
	// estimate 800: allowed=false rule="" used=300 calls=2
}
