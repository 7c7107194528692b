package limittest

import (
	"errors"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// testReset (stores that are limit.Resetter): Reset drops the counters it
// names and only those, reports how many held a counter, refuses a key that
// is not a counter's before deleting anything, and a slot it dropped may
// still be released harmlessly.
func testReset(c *tcase) {
	rs, ok := c.h.Store.(limit.Resetter)
	if !ok {
		c.t.Skip("store is not a limit.Resetter")
	}
	c.align()
	r := c.rule("reset", 3)
	a, b := c.check(keyspace.PerTenant, r), c.check(keyspace.PerTenantTool, r)
	var lease string
	for range 2 {
		lease = c.take(1, a, b).Lease
	}
	peek := func(label string, ch limit.Check, remaining int64) {
		c.t.Helper()
		// A cost above capacity is denied without charging: it reads the state.
		d := c.take(r.Capacity()+1, ch)
		if d.Allowed || d.Results[0].Remaining != remaining {
			c.t.Fatalf("%s: allowed %v, remaining %d, want denied with %d", label, d.Allowed, d.Results[0].Remaining, remaining)
		}
	}
	if c.alg != limit.Concurrency {
		peek("before reset", a, 1)
	}
	meter := keyspace.Usage(c.owner.Tenant, "2025-03")
	if _, err := rs.Reset(c.ctx, []string{a.Key, meter}); !errors.Is(err, limit.ErrNotCounter) {
		c.t.Fatalf("reset of a usage key: %v, want ErrNotCounter", err)
	}
	n, err := rs.Reset(c.ctx, []string{a.Key, keyspace.RateLimit(keyspace.PerTenant, "never-used", c.owner)})
	if err != nil || n != 1 {
		c.t.Fatalf("reset: %d, %v; want 1 counter", n, err)
	}
	if c.alg == limit.Concurrency {
		// The dropped slots are free; the old lease releases nothing.
		if err := c.h.Store.Release(c.ctx, []limit.Check{a}, lease); err != nil {
			c.t.Fatalf("release after reset: %v", err)
		}
		for i := range 3 {
			if d := c.take(1, a); !d.Allowed {
				c.t.Fatalf("take %d after reset denied: %+v", i, d)
			}
		}
		// The counter not reset still holds its two slots: one is free.
		if d := c.take(1, b); !d.Allowed || d.Remaining != 0 {
			c.t.Fatalf("the counter not reset: %+v, want its last slot", d)
		}
		return
	}
	peek("after reset", a, 3)
	peek("not reset", b, 1)
	if n, err := rs.Reset(c.ctx, []string{a.Key}); err != nil || n != 0 {
		c.t.Fatalf("reset of an empty counter: %d, %v; want 0", n, err)
	}
}
