package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// Open creates the file and its schema. Put keeps the largest snapshot of a
// tenant's period, field by field: a retried flush, or a late one from
// another instance carrying an older snapshot, never counts twice or lowers
// a total.
func ExampleStore_Put() {
	dir, err := os.MkdirTemp("", "sqlite-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "usage.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	fmt.Printf("migration: %+v\n", db.Migration())

	ctx := context.Background()
	at := func(hour int) time.Time { return time.Date(2025, 6, 14, hour, 0, 0, 0, time.UTC) }
	snapshot := func(charged, calls int64, hour int) usage.Record {
		return usage.Record{Tenant: "acme", Period: "2025-06", Usage: limit.Usage{Charged: charged, Calls: calls}, UpdatedAt: at(hour)}
	}
	for _, r := range []usage.Record{
		snapshot(40, 4, 9),
		snapshot(40, 4, 10), // the same flush, retried: adds nothing
		snapshot(25, 2, 11), // an older snapshot landing late
		snapshot(55, 5, 12),
	} {
		if err := db.Put(ctx, []usage.Record{r}); err != nil {
			panic(err)
		}
		got, _, err := db.Get(ctx, "acme", "2025-06")
		if err != nil {
			panic(err)
		}
		fmt.Printf("put %d/%d: stored charged=%d calls=%d updated=%s\n",
			r.Charged, r.Calls, got.Charged, got.Calls, got.UpdatedAt.Format("15:04"))
	}
	_, ok, err := db.Get(ctx, "globex", "2025-06")
	fmt.Println("globex found:", ok, err)
	// Output:
	// migration: {From:0 To:1 Created:true}
	// put 40/4: stored charged=40 calls=4 updated=09:00
	// put 40/4: stored charged=40 calls=4 updated=09:00
	// put 25/2: stored charged=40 calls=4 updated=09:00
	// put 55/5: stored charged=55 calls=5 updated=12:00
	// globex found: false <nil>
}
