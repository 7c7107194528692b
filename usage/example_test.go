package usage_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/limittest"
	"github.com/mcpgate/mcpgate/limit/memstore"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// Calls are charged on a live meter in the limit store; a Flusher writes
// the meter to the durable store (here SQLite), and after a restart that
// lost the live counters the meter is re-created from the durable total.
func Example() {
	dir, err := os.MkdirTemp("", "usage-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "usage.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	ctx := context.Background()
	now := time.Date(2025, 6, 14, 9, 30, 0, 0, time.UTC) // fixed clocks keep the output stable
	period := usage.Period(now)
	end, err := usage.PeriodEnd(period)
	if err != nil {
		panic(err)
	}
	opts := &usage.FlusherOptions{Now: func() time.Time { return now }}

	// charge makes calls of cost 5 on a fresh limit store (a gateway that
	// just started), seeding the meter from the durable total first.
	charge := func(calls int) {
		live, err := memstore.New(&memstore.Options{Clock: limittest.NewFakeClock(now)})
		if err != nil {
			panic(err)
		}
		defer live.Close()
		flusher := usage.NewFlusher(live, db, opts)

		seed, err := flusher.Seed(ctx, "acme", period)
		if err != nil {
			panic(err) // the durable store is down: never seed with a guess
		}
		m := limit.Meter{
			Key: keyspace.Usage("acme", period), Tenant: "acme", Period: period,
			Quota: 100, Seed: seed, Seeded: true,
			ExpireAt: end.Add(7 * 24 * time.Hour), // a week of grace for the last flush
		}
		for range calls {
			_, mr, err := live.TakeMetered(ctx, nil, m, 5)
			if err != nil {
				panic(err)
			}
			flusher.Track(m.Key) // on the request path: no I/O
			fmt.Printf("charged: used=%d calls=%d\n", mr.Usage.Used(), mr.Usage.Calls)
		}
		fmt.Println("pending before flush:", flusher.Pending())
		// Run does this every second, and once more when its ctx ends.
		if err := flusher.Flush(ctx); err != nil {
			panic(err)
		}
		fmt.Println("pending after flush:", flusher.Pending())
	}

	charge(3)
	charge(1) // restarted: the live meter is gone, the durable total is not

	rec, ok, err := db.Get(ctx, "acme", period)
	if err != nil || !ok {
		panic(fmt.Sprint(ok, err))
	}
	fmt.Printf("durable %s %s: used=%d calls=%d updated=%s\n",
		rec.Tenant, rec.Period, rec.Used(), rec.NetCalls(), rec.UpdatedAt.Format(time.RFC3339))
	// Output:
	// charged: used=5 calls=1
	// charged: used=10 calls=2
	// charged: used=15 calls=3
	// pending before flush: 1
	// pending after flush: 0
	// charged: used=20 calls=4
	// pending before flush: 1
	// pending after flush: 0
	// durable acme 2025-06: used=20 calls=4 updated=2025-06-14T09:30:00Z
}
