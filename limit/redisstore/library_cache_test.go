package redisstore

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// The function library keeps at most 1024 parsed rules and headers, then
// starts over: past that many distinct ones, every rule still decides as
// its own (limits 1..1100 here, each taken whole at once, then denied),
// and so does every header (the cost is the limit).
func TestLibraryCachesStartOver(t *testing.T) {
	_, _, s := startStore(t)
	ctx := ctxT(t)
	for round := range 2 {
		for lim := int64(1); lim <= 1100; lim++ {
			checks := tenantChecks("cache-over", rule("r", limit.FixedWindow, lim, time.Hour))
			checks[0].Key += "-" + time.Duration(lim).String()
			d, err := s.Take(ctx, checks, lim)
			if err != nil {
				t.Fatal(err)
			}
			if want := round == 0; d.Allowed != want || d.Remaining != 0 {
				t.Fatalf("round %d, limit %d, cost %d: %+v; want allowed %v", round, lim, lim, d, want)
			}
		}
	}
}
