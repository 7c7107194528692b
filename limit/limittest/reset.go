package limittest

import (
	"errors"
	"slices"

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

// testHeldCounters (stores that are limit.CounterLister): HeldCounters
// finds a rule's per-tool counters of one owner, whatever their tool
// (hostile names included), and nothing else: not the owner's other
// counters, not another subject's or tenant's, not a dropped one; and it
// refuses a prefix that is not one tenant's counters.
func testHeldCounters(c *tcase) {
	ls, ok := c.h.Store.(limit.CounterLister)
	if !ok {
		c.t.Skip("store is not a limit.CounterLister")
	}
	rs, _ := c.h.Store.(limit.Resetter)
	r := c.rule("held", 5)
	alg := string(c.alg)
	at := func(per keyspace.Per, o keyspace.Owner) limit.Check {
		return limit.Check{Rule: r, Key: keyspace.Counter(per, alg, r.Name, o)}
	}
	var want []string
	for _, tool := range []string{"search", "a:b", "x*y?[z]", "{t}", ""} {
		o := c.owner
		o.Tool = tool
		ch := at(keyspace.PerTenantTool, o)
		c.take(1, ch)
		want = append(want, ch.Key)
	}
	other := c.owner
	other.Tenant += "-other"
	otherSubject := c.owner
	otherSubject.Subject += "-other"
	c.take(1, at(keyspace.PerTenant, c.owner), at(keyspace.PerSubjectTool, c.owner))
	c.take(1, at(keyspace.PerTenantTool, other)) // another slot
	c.take(1, at(keyspace.PerSubjectTool, otherSubject))
	c.take(1, limit.Check{Rule: c.rule("held-other", 5), Key: keyspace.Counter(keyspace.PerTenantTool, alg, "held-other", c.owner)})

	held := func(per keyspace.Per, o keyspace.Owner) []string {
		c.t.Helper()
		keys, err := ls.HeldCounters(c.ctx, keyspace.ToolCounters(per, alg, r.Name, o))
		if err != nil {
			c.t.Fatalf("HeldCounters: %v", err)
		}
		slices.Sort(keys)
		return keys
	}
	slices.Sort(want)
	if got := held(keyspace.PerTenantTool, c.owner); !slices.Equal(got, want) {
		c.t.Fatalf("tenant_tool counters held:\n%q\nwant\n%q", got, want)
	}
	if got := held(keyspace.PerSubjectTool, c.owner); !slices.Equal(got, []string{at(keyspace.PerSubjectTool, c.owner).Key}) {
		c.t.Fatalf("subject_tool counters held: %q", got)
	}
	for _, bad := range []string{keyspace.Usage(c.owner.Tenant, "2025-03"), "mcpgate:rl:{" + c.owner.Tenant, ""} {
		if _, err := ls.HeldCounters(c.ctx, bad); !errors.Is(err, limit.ErrNotCounter) {
			c.t.Fatalf("HeldCounters(%q): %v, want ErrNotCounter", bad, err)
		}
	}
	if rs == nil {
		return
	}
	if n, err := rs.Reset(c.ctx, want[:1]); err != nil || n != 1 {
		c.t.Fatalf("reset: %d, %v", n, err)
	}
	if got := held(keyspace.PerTenantTool, c.owner); !slices.Equal(got, want[1:]) {
		c.t.Fatalf("after a reset, held %q, want %q", got, want[1:])
	}
}
