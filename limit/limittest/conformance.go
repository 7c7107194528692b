package limittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// Harness is one store under test, with the hooks the conformance suite
// needs to drive its clock and inspect its keys.
type Harness struct {
	// Store is the store under test. RunConformance calls the harness
	// constructor once per subtest, so a store (and its clock) is never
	// shared between subtests; stores may share a server.
	Store limit.Store
	// Advance moves the store's clock forward by d (d >= 0).
	Advance func(d time.Duration)
	// TTLs returns every key the store holds, with its time to live. Keys of
	// other subtests may be included (they are filtered out by tenant).
	TTLs func(t *testing.T) map[string]time.Duration
	// FlushScripts drops the server-side scripts, so that the next call
	// meets NOSCRIPT. Nil when the store has no scripts (memory).
	FlushScripts func(t *testing.T)
	// RealTime reports that the store's clock also moves with real time (the
	// Redis server's TIME), not only through Advance. The suite then accepts
	// durations shorter than expected by the real time elapsed in the
	// subtest, and keeps every decision away from sub-second boundaries.
	// False means the clock moves only through Advance, and every duration
	// must be exact to the microsecond.
	RealTime bool
	// Now returns the store's clock (with what Advance added). Optional:
	// the meter scenarios use it to set Meter.ExpireAt relative to the
	// store and to check the meters' TTLs; nil means time.Now, and TTLs are
	// then only checked to be positive.
	Now func() time.Time
}

// RunConformance runs the conformance suite: subtests named
// "<algorithm>/<scenario>" for every algorithm in limit.Algorithms, each on
// a fresh Harness from newHarness and on counters of its own (random
// tenants and rule names), so subtests run in parallel.
//
// Scenarios: burst, refill, cost, refund, release, invalid,
// all_or_nothing, hostile_keys, noscript (stores with scripts only), ttl,
// concurrent, reset (stores that are limit.Resetter), and model (a random sequence of calls compared, decision by
// decision, with the reference algorithms of limit/internal/algo).
//
// When the store is a limit.MeteredStore, the usage-meter scenarios run
// too, as subtests "meter/<scenario>" (see meterScenarios), and when it is
// a limit.GuardedStore, the loop-breaker scenarios, as subtests
// "breaker/<scenario>" (see breakerScenarios), and the scenarios of
// requests with global checks, as subtests "layered/<scenario>" (see
// layeredScenarios).
//
// newHarness is called once more on t itself, to learn whether the store
// has scripts and meters; it must register any cleanup with the t it is
// given. Set LIMITTEST_SEED (SeedEnv) to replay a model sequence a failure
// logged.
func RunConformance(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	h0 := newHarness(t)
	scripts := h0.FlushScripts != nil
	_, metered := h0.Store.(limit.MeteredStore)
	for _, alg := range limit.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			for _, sc := range scenarios {
				if sc.scripts && !scripts {
					continue
				}
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(newCase(t, newHarness(t), alg))
				})
			}
		})
	}
	if metered {
		runMeterScenarios(t, newHarness, scripts)
	}
	if _, guarded := h0.Store.(limit.GuardedStore); guarded {
		runBreakerScenarios(t, newHarness, scripts)
		runLayeredScenarios(t, newHarness)
	}
}

type scenario struct {
	name    string
	scripts bool // needs Harness.FlushScripts
	run     func(c *tcase)
}

var scenarios = []scenario{
	{name: "burst", run: testBurst},
	{name: "refill", run: testRefill},
	{name: "cost", run: testCost},
	{name: "refund", run: testRefund},
	{name: "release", run: testRelease},
	{name: "invalid", run: testInvalid},
	{name: "all_or_nothing", run: testAllOrNothing},
	{name: "hostile_keys", run: testHostileKeys},
	{name: "noscript", scripts: true, run: testNoScript},
	{name: "ttl", run: testTTL},
	{name: "concurrent", run: testConcurrent},
	{name: "model", run: testModel},
	{name: "reset", run: testReset},
	{name: "held_counters", run: testHeldCounters},
}

// tcase is one subtest: a harness, the algorithm under test and an owner
// (tenant, subject, tool) of its own.
type tcase struct {
	t     *testing.T
	h     Harness
	alg   limit.Algorithm
	ctx   context.Context
	id    string
	owner keyspace.Owner
	began time.Time
}

func newCase(t *testing.T, h Harness, alg limit.Algorithm) *tcase {
	if h.Store == nil || h.Advance == nil || h.TTLs == nil {
		t.Fatal("limittest: Harness needs Store, Advance and TTLs")
	}
	id := randomID()
	return &tcase{
		t:     t,
		h:     h,
		alg:   alg,
		ctx:   t.Context(),
		id:    id,
		owner: keyspace.Owner{Tenant: "tenant-" + id, Subject: "alice", Tool: "search"},
		began: time.Now(),
	}
}

func randomID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Standard rules. Every period divides an hour, so that one alignment to an
// hour boundary (align) puts every window rule at the start of a window.
const (
	windowPeriod = time.Hour        // fixed_window, sliding_window(_counter)
	leasePeriod  = 10 * time.Minute // concurrency
	// token_bucket and gcra: 60 per hour, one unit a minute, Burst = capacity
	bucketLimit  = 60
	bucketPeriod = time.Hour
	bucketUnit   = time.Minute // bucketPeriod / bucketLimit
)

// ruleFor is the standard rule of algorithm alg whose capacity (largest
// cost, Burst or Limit) is capacity.
func ruleFor(alg limit.Algorithm, name string, capacity int64) limit.Rule {
	r := limit.Rule{Name: name, Algorithm: alg, Limit: capacity, Period: windowPeriod}
	switch alg {
	case limit.TokenBucket, limit.GCRA:
		r.Limit, r.Period, r.Burst = bucketLimit, bucketPeriod, capacity
	case limit.Concurrency:
		r.Period = leasePeriod
	}
	return r
}

// rule is ruleFor for the algorithm under test.
func (c *tcase) rule(name string, capacity int64) limit.Rule { return ruleFor(c.alg, name, capacity) }

// check is the check of r under scope per for the case's owner.
func (c *tcase) check(per keyspace.Per, r limit.Rule) limit.Check {
	return limit.Check{Rule: r, Key: keyspace.RateLimit(per, r.Name, c.owner)}
}

// other is an algorithm other than the one under test, for mixed batches.
func (c *tcase) other() limit.Algorithm {
	for i, a := range limit.Algorithms {
		if a == c.alg {
			return limit.Algorithms[(i+1)%len(limit.Algorithms)]
		}
	}
	return limit.TokenBucket
}

// checkPace fails a model sequence on a real-time store once it has taken
// more than half a tick since the last align: past that, the store's clock
// may cross a tick the model does not, and their decisions may differ.
func (c *tcase) checkPace() {
	if c.h.RealTime && time.Since(c.began) > tick/2 {
		c.t.Fatalf("the sequence took %v of real time: more than half a tick, decisions may differ from the model's", time.Since(c.began))
	}
}

// align moves the store's clock to the start of an hour (every standard
// window starts there), so that window algorithms give known numbers.
func (c *tcase) align() {
	c.t.Helper()
	probe := limit.Rule{Name: "align", Algorithm: limit.FixedWindow, Limit: 1, Period: time.Hour}
	key := keyspace.RateLimit(keyspace.PerTenant, probe.Name, keyspace.Owner{Tenant: "align-" + c.id})
	began := time.Now() // the probe reads the store's clock after this
	d := c.take(1, limit.Check{Rule: probe, Key: key})
	if d.ResetAfter <= 0 || d.ResetAfter > time.Hour {
		c.t.Fatalf("align: fixed window of an hour reports ResetAfter %v", d.ResetAfter)
	}
	c.h.Advance(d.ResetAfter)
	c.began = began
}

// step is the margin kept before a boundary: the store must still deny one
// step before the time it announced. One microsecond on an exact clock; a
// second when real time also moves the clock.
func (c *tcase) step() time.Duration {
	if c.h.RealTime {
		return time.Second
	}
	return time.Microsecond
}

func (c *tcase) advance(d time.Duration) {
	c.t.Helper()
	if d < 0 {
		c.t.Fatalf("advance by negative %v", d)
	}
	c.h.Advance(d)
}

// take runs Take and fails the test on an error; it also checks the shape
// of the decision every store must give.
func (c *tcase) take(cost int64, checks ...limit.Check) limit.Decision {
	c.t.Helper()
	d, err := c.h.Store.Take(c.ctx, checks, cost)
	if err != nil {
		c.t.Fatalf("Take(cost %d, %d checks): %v", cost, len(checks), err)
	}
	c.shape(d, checks)
	return d
}

// shape checks what holds for every decision whatever the counters hold.
func (c *tcase) shape(d limit.Decision, checks []limit.Check) {
	c.t.Helper()
	if len(d.Results) != len(checks) {
		c.t.Fatalf("decision has %d results for %d checks", len(d.Results), len(checks))
	}
	slot := false // a concurrency check allowed: an admitted request takes a slot
	for i, r := range d.Results {
		slot = slot || checks[i].Rule.Algorithm == limit.Concurrency && r.Allowed
		if r.Remaining < 0 || r.ResetAfter < 0 {
			c.t.Errorf("result %d (%s): negative Remaining %d or ResetAfter %v", i, checks[i].Rule.Name, r.Remaining, r.ResetAfter)
		}
		if r.Allowed != (r.RetryAfter == 0) {
			c.t.Errorf("result %d (%s): Allowed %v with RetryAfter %v", i, checks[i].Rule.Name, r.Allowed, r.RetryAfter)
		}
	}
	// limit.Decision: "Lease identifies the slots taken by Concurrency checks
	// of an admitted request; Empty otherwise."
	if want := d.Allowed && slot; want != (d.Lease != "") {
		c.t.Errorf("decision (allowed %v, concurrency slot taken %v) has lease %q", d.Allowed, slot, d.Lease)
	}
}

// want is the expected outcome of a decision or a result. Durations equal
// to anyDuration are not checked.
type want struct {
	allowed    bool
	remaining  int64
	reset      time.Duration
	retry      time.Duration
	anyRetries bool // only check that RetryAfter is positive and not Never
}

const anyDuration = time.Duration(math.MinInt64)

// expect checks a decision decided by rule.
func (c *tcase) expect(label string, d limit.Decision, rule limit.Rule, w want) {
	c.t.Helper()
	if d.Rule != rule {
		c.t.Errorf("%s: deciding rule %+v, want %+v", label, d.Rule, rule)
	}
	if d.Limit != limitOf(rule) {
		c.t.Errorf("%s: Limit %d, want %d", label, d.Limit, limitOf(rule))
	}
	c.expectResult(label, limit.Result{Allowed: d.Allowed, Remaining: d.Remaining, ResetAfter: d.ResetAfter, RetryAfter: d.RetryAfter}, w)
}

// limitOf is the Decision.Limit of a decision decided by r.
func limitOf(r limit.Rule) int64 {
	if r.Algorithm == limit.TokenBucket || r.Algorithm == limit.GCRA {
		return r.Capacity()
	}
	return r.Limit
}

func (c *tcase) expectResult(label string, r limit.Result, w want) {
	c.t.Helper()
	if r.Allowed != w.allowed {
		c.t.Errorf("%s: Allowed %v, want %v (result %+v)", label, r.Allowed, w.allowed, r)
		return
	}
	if r.Remaining != w.remaining {
		c.t.Errorf("%s: Remaining %d, want %d", label, r.Remaining, w.remaining)
	}
	c.near(label+": ResetAfter", r.ResetAfter, w.reset)
	switch {
	case w.allowed:
		if r.RetryAfter != 0 {
			c.t.Errorf("%s: allowed with RetryAfter %v", label, r.RetryAfter)
		}
	case w.anyRetries:
		if r.RetryAfter <= 0 {
			c.t.Errorf("%s: RetryAfter %v, want a positive duration", label, r.RetryAfter)
		}
	default:
		c.near(label+": RetryAfter", r.RetryAfter, w.retry)
	}
}

// near checks a duration: exactly on an exact clock; on a real-time clock,
// no longer than want and shorter by at most the real time elapsed since
// the subtest (or its last align) began. Never and zero are always exact.
func (c *tcase) near(label string, got, want time.Duration) {
	c.t.Helper()
	if want == anyDuration {
		return
	}
	if !c.h.RealTime || want == limit.Never || want == 0 || got == limit.Never {
		if got != want {
			c.t.Errorf("%s = %v, want %v", label, got, want)
		}
		return
	}
	slack := time.Since(c.began) + 2*time.Millisecond
	if got > want || got < want-slack {
		c.t.Errorf("%s = %v, want %v (minus at most %v of real time)", label, got, want, slack)
	}
}

// refund and release fail the test on an error.
func (c *tcase) refund(cost int64, lease string, checks ...limit.Check) {
	c.t.Helper()
	if err := c.h.Store.Refund(c.ctx, checks, cost, lease); err != nil {
		c.t.Fatalf("Refund(cost %d, lease %q): %v", cost, lease, err)
	}
}

func (c *tcase) release(lease string, checks ...limit.Check) {
	c.t.Helper()
	if err := c.h.Store.Release(c.ctx, checks, lease); err != nil {
		c.t.Fatalf("Release(lease %q): %v", lease, err)
	}
}

// exhaust takes cost-1 requests until one is denied and returns how many
// were admitted (at most max+1 tries).
func (c *tcase) exhaust(max int, checks ...limit.Check) int {
	c.t.Helper()
	for n := 0; n <= max; n++ {
		if d := c.take(1, checks...); !d.Allowed {
			return n
		}
	}
	return max + 1
}

// expectErr checks that err wraps target.
func (c *tcase) expectErr(label string, err, target error) {
	c.t.Helper()
	if !errors.Is(err, target) {
		c.t.Errorf("%s: error %v, want one wrapping %v", label, err, target)
	}
}
