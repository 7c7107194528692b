package limittest

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// testAllOrNothing: in a batch, one exhausted enforced rule denies the
// request and nothing is charged anywhere; a shadow rule that denies does
// not deny the request.
func testAllOrNothing(c *tcase) {
	c.align()
	rT := c.rule("tenant", 10)
	rTT := c.rule("tool", 2)
	rS := c.rule("subject", 5)
	rO := ruleFor(c.other(), "other", 10)
	sh1 := c.rule("shadow-1", 1)
	sh1.Shadow = true
	sh3 := c.rule("shadow-3", 3)
	sh3.Shadow = true
	batch := []limit.Check{
		c.check(keyspace.PerTenant, rT),
		c.check(keyspace.PerTenantTool, rTT),
		c.check(keyspace.PerSubject, rS),
		c.check(keyspace.PerSubjectTool, rO),
		c.check(keyspace.PerTenant, sh1),
		c.check(keyspace.PerSubject, sh3),
	}
	res := func(label string, d limit.Decision, ws ...want) {
		c.t.Helper()
		for i, w := range ws {
			w.reset = anyDuration
			if !w.allowed {
				w.anyRetries = true
			}
			c.expectResult(fmt.Sprintf("%s: %s", label, batch[i].Rule.Name), d.Results[i], w)
		}
	}
	ok := func(n int64) want { return want{allowed: true, remaining: n} }
	no := want{}

	d := c.take(1, batch...)
	c.expect("take 1", d, rTT, want{allowed: true, remaining: 1, reset: anyDuration})
	res("take 1", d, ok(9), ok(1), ok(4), ok(9), ok(0), ok(2))

	d = c.take(1, batch...)
	c.expect("take 2 (shadow denies)", d, rTT, want{allowed: true, remaining: 0, reset: anyDuration})
	res("take 2", d, ok(8), ok(0), ok(3), ok(8), no, ok(1))

	// Denied: the allowing checks report what they would have left.
	d = c.take(1, batch...)
	c.expect("take 3 (tool rule exhausted)", d, rTT, want{remaining: 0, reset: anyDuration, anyRetries: true})
	res("take 3", d, ok(7), no, ok(2), ok(7), no, ok(0))
	d = c.take(2, batch...)
	if d.Allowed {
		c.t.Fatal("take 4 (cost 2) admitted")
	}

	// Nothing was charged by the denied requests.
	for _, i := range []int{0, 2, 3, 5} {
		left := batch[i].Rule.Capacity() - 3
		got := c.take(1, batch[i])
		c.expectResult("alone after denials: "+batch[i].Rule.Name, got.Results[0], want{allowed: true, remaining: left, reset: anyDuration})
	}
	// A batch of shadow checks only is never denied.
	d = c.take(1, batch[5])
	if !d.Allowed || d.Results[0].Allowed || d.Rule != sh3 {
		c.t.Errorf("shadow-only batch on an exhausted counter: %+v, want admitted, result denied, rule %s", d, sh3.Name)
	}
}

// hostileTenants are tenant names that must each get counters of their own.
var hostileTenants = []string{
	"a}b", "x:y", "{", "}", "{}", "", "~", "~g", "~h",
	strings.Repeat("x", 10000), strings.Repeat("x", 9999) + "y",
	"\xff\xfe", "\xff", "a%3Ab", "a:b", "a%7Db", "a b", "a\x00b", "ü",
}

// testHostileKeys: escaped components never collide, and all of a hostile
// tenant's counters share one slot (Cluster: no cross-slot error).
func testHostileKeys(c *tcase) {
	c.align()
	r := c.rule("hostile-"+c.id, 2)
	for _, tenant := range hostileTenants {
		ch := limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerTenant, r.Name, keyspace.Owner{Tenant: tenant})}
		if n := c.exhaust(5, ch); n != 2 {
			c.t.Errorf("tenant %.20q: %d admitted on its own counter, want 2 (a shared counter?)", tenant, n)
		}
	}
	rb := c.rule("hostile-batch-"+c.id, 3)
	for _, tenant := range hostileTenants {
		o := keyspace.Owner{Tenant: tenant, Subject: "s{x}:y", Tool: "t:}{"}
		var batch []limit.Check
		slots := map[uint16]bool{}
		for _, per := range []keyspace.Per{keyspace.PerTenant, keyspace.PerTenantTool, keyspace.PerSubject, keyspace.PerSubjectTool} {
			k := keyspace.RateLimit(per, rb.Name, o)
			batch = append(batch, limit.Check{Rule: rb, Key: k})
			slots[keyspace.Slot(k)] = true
		}
		if len(slots) != 1 {
			c.t.Errorf("tenant %.20q: batch keys in %d slots", tenant, len(slots))
		}
		d, err := c.h.Store.Take(c.ctx, batch, 1)
		if err != nil {
			c.t.Errorf("tenant %.20q: batch: %v", tenant, err)
			continue
		}
		for i, res := range d.Results {
			if !res.Allowed || res.Remaining != 2 {
				c.t.Errorf("tenant %.20q: batch check %d: %+v, want admitted with 2 left", tenant, i, res)
			}
		}
	}
	// Subject and tool separators cannot be forged either.
	pairs := [][2]keyspace.Owner{
		{{Tenant: "t", Subject: "s:t", Tool: "u"}, {Tenant: "t", Subject: "s", Tool: "t:u"}},
		{{Tenant: "t", Subject: "a%3Ab", Tool: "u"}, {Tenant: "t", Subject: "a:b", Tool: "u"}},
	}
	for _, p := range pairs {
		a := limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerSubjectTool, r.Name, p[0])}
		b := limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerSubjectTool, r.Name, p[1])}
		if n := c.exhaust(5, a); n != 2 {
			c.t.Errorf("owner %+v: %d admitted, want 2", p[0], n)
		}
		if n := c.exhaust(5, b); n != 2 {
			c.t.Errorf("owner %+v: %d admitted after %+v was exhausted, want 2", p[1], n, p[0])
		}
	}
	// A global counter (its own slot) works alone.
	g := limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerGlobal, r.Name, keyspace.Owner{})}
	if n := c.exhaust(5, g); n != 2 {
		c.t.Errorf("global counter: %d admitted, want 2", n)
	}
}

// testNoScript: after the server forgets its scripts, every call still
// works and applies exactly once.
func testNoScript(c *tcase) {
	c.align()
	r := c.rule("noscript", 5)
	ch := c.check(keyspace.PerTenant, r)
	d1 := c.take(1, ch)
	c.expect("before flush", d1, r, want2(4))
	c.h.FlushScripts(c.t)
	d2 := c.take(1, ch)
	c.expect("take after flush", d2, r, want2(3))
	c.h.FlushScripts(c.t)
	c.refund(1, d2.Lease, ch)
	c.expect("take after a refund after flush", c.take(1, ch), r, want2(3))
	c.h.FlushScripts(c.t)
	c.release(d1.Lease, ch)
	left := int64(2)
	if c.alg == limit.Concurrency {
		left = 3 // d1's slot came back
	}
	c.expect("take after a release after flush", c.take(1, ch), r, want2(left))
}

// horizon is the longest TTL a counter of r may have: the time after which
// it is back to full capacity whatever it holds.
func horizon(r limit.Rule) time.Duration {
	switch r.Algorithm {
	case limit.SlidingWindowCounter:
		return 2 * r.Period
	case limit.TokenBucket:
		return time.Duration(r.Capacity()) * r.Period / time.Duration(r.Limit)
	case limit.GCRA:
		return time.Duration(r.Capacity()) * ((r.Period + time.Duration(r.Limit) - 1) / time.Duration(r.Limit))
	}
	return r.Period
}

// tenantTTLs returns the keys of tenant the store holds, with their TTLs.
func (c *tcase) tenantTTLs(tenant string) map[string]time.Duration {
	c.t.Helper()
	tag := "{" + keyspace.Escape(tenant) + "}"
	out := map[string]time.Duration{}
	for k, ttl := range c.h.TTLs(c.t) {
		if strings.Contains(k, tag) {
			out[k] = ttl
		}
	}
	return out
}

// testTTL: after a mix of calls every key has a TTL within the rule's
// horizon; on an exact clock, keys are gone once past it.
func testTTL(c *tcase) {
	c.align()
	rT := c.rule("ttl-tenant", 5)
	rTT := c.rule("ttl-tool", 3)
	batch := []limit.Check{c.check(keyspace.PerTenant, rT), c.check(keyspace.PerTenantTool, rTT)}
	d1 := c.take(1, batch...)
	c.take(2, batch...)
	if c.alg == limit.Concurrency {
		c.take(1, batch...) // one slot per call whatever the cost
	}
	if d := c.take(1, batch...); d.Allowed {
		c.t.Fatal("over capacity admitted")
	}
	c.refund(1, d1.Lease, batch...)
	c.advance(30 * time.Second)
	c.take(1, batch[0])

	ttls := c.tenantTTLs(c.owner.Tenant)
	var keys []string
	for k := range ttls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	want := []string{batch[0].Key, batch[1].Key}
	sort.Strings(want)
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		c.t.Errorf("store holds keys %q for the tenant, want %q", keys, want)
	}
	for i, ch := range batch {
		ttl, ok := ttls[ch.Key]
		if !ok {
			continue
		}
		if ttl <= 0 || ttl > horizon(ch.Rule) {
			c.t.Errorf("check %d (%s): TTL %v, want in (0, %v]", i, ch.Rule.Name, ttl, horizon(ch.Rule))
		}
	}
	if c.h.RealTime {
		return // the server expires keys on its own clock, which Advance does not move
	}
	c.advance(horizon(rT)) // from the last write
	if n := len(c.tenantTTLs(c.owner.Tenant)); n != 0 {
		c.t.Errorf("%d keys left once every counter is back to full capacity", n)
	}
}

// testConcurrent: many goroutines on one counter admit exactly its
// capacity; in a batch, exactly the smallest capacity, charging the other
// rule exactly that much; take-then-refund loops leave the counter full.
func testConcurrent(c *tcase) {
	c.align()
	const workers = 64
	hammer := func(tries int, cost int64, refund bool, checks ...limit.Check) int64 {
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range tries {
					d, err := c.h.Store.Take(c.ctx, checks, cost)
					if err != nil {
						c.t.Errorf("Take: %v", err)
						return
					}
					if !d.Allowed {
						continue
					}
					admitted.Add(1)
					if refund {
						if err := c.h.Store.Refund(c.ctx, checks, cost, d.Lease); err != nil {
							c.t.Errorf("Refund: %v", err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		return admitted.Load()
	}

	r := c.rule("hammer", 50)
	ch := c.check(keyspace.PerTenant, r)
	if n := hammer(20, 1, false, ch); n != 50 {
		c.t.Errorf("%d goroutines x 20 tries on a capacity of 50: %d admitted, want exactly 50", workers, n)
	}
	if d := c.take(1, ch); d.Allowed {
		c.t.Error("admitted after the hammering")
	}

	rA := c.rule("hammer-a", 40)
	rB := c.rule("hammer-b", 25)
	batch := []limit.Check{c.check(keyspace.PerSubject, rA), c.check(keyspace.PerSubjectTool, rB)}
	if n := hammer(8, 1, false, batch...); n != 25 {
		c.t.Errorf("batch of capacities 40 and 25: %d admitted, want exactly 25", n)
	}
	c.expect("capacity 40 after 25 admitted", c.take(1, batch[0]), rA, want2(14))

	rR := c.rule("hammer-refund", 10)
	chR := c.check(keyspace.PerTenantTool, rR)
	if n := hammer(10, 1, true, chR); n < 10 {
		c.t.Errorf("take-and-refund loops: only %d admitted, want at least 10", n)
	}
	if n := c.exhaust(20, chR); n != 10 {
		c.t.Errorf("after take-and-refund loops: %d admitted, want the full 10", n)
	}
}
