package limittest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// The model scenario drives a store with a random sequence of Take, Refund,
// Release and clock advances over a few counters, and compares every
// decision with the reference algorithms (limit/internal/algo) run on the
// same calls: the store must return exactly the model's Allowed, Rule,
// Limit and Remaining, and its durations (exact on an exact clock).
//
// A store whose clock also follows real time is ahead of the model by the
// real time elapsed, a few milliseconds. So that this never changes a
// decision, the clock only moves by whole ticks and every rule is chosen so
// that each boundary (window start, token arrival, GCRA emission, lease
// expiry, the sliding window counter's weights) falls on a whole tick: a
// store a fraction of a tick ahead decides exactly as the model does, and
// its durations are shorter by at most that fraction.

// tick is the step of the model's clock.
const tick = 10 * time.Second

// modelOps is the length of one random sequence.
const modelOps = 150

// SeedEnv names the environment variable that fixes the model scenario's
// random seed (a decimal uint64), to replay a failure it logged.
const SeedEnv = "LIMITTEST_SEED"

// modelRules returns three rules of alg whose boundaries all fall on whole
// ticks (Period/Limit, and Period/k for every k up to Limit, are multiples of
// tick; periods divide an hour so windows start on the hour). The third is
// a shadow rule.
func modelRules(alg limit.Algorithm, prefix string) [3]limit.Rule {
	var rs [3]limit.Rule
	switch alg {
	case limit.TokenBucket, limit.GCRA:
		rs = [3]limit.Rule{
			{Limit: 6, Period: time.Hour, Burst: 4},
			{Limit: 4, Period: 20 * time.Minute},
			{Limit: 3, Period: 30 * time.Minute, Burst: 6},
		}
	case limit.Concurrency:
		rs = [3]limit.Rule{
			{Limit: 3, Period: 20 * time.Minute},
			{Limit: 2, Period: 10 * time.Minute},
			{Limit: 1, Period: 30 * time.Minute},
		}
	default:
		rs = [3]limit.Rule{
			{Limit: 6, Period: time.Hour},
			{Limit: 4, Period: 20 * time.Minute},
			{Limit: 3, Period: 30 * time.Minute},
		}
	}
	for i := range rs {
		rs[i].Name = fmt.Sprintf("%s%d", prefix, i+1)
		rs[i].Algorithm = alg
	}
	rs[2].Shadow = true
	return rs
}

// admission is a request the store admitted, kept for a later Refund or
// Release.
type admission struct {
	checks  []limit.Check // the whole batch
	charged []limit.Check // the checks that allowed (and were charged)
	cost    int64
	lease   string
}

type model struct {
	c       *tcase
	rnd     *rand.Rand
	now     int64 // µs on the model's clock
	states  map[string]*algo.State
	granted []admission
	history []string
	// what the sequence exercised, so that a vacuous one fails
	admitted, denied, never, refunds, releases int
}

// seed is a model sequence's seed: SeedEnv's value when set, else a random
// one. It is logged, so that a failure can be replayed.
func (c *tcase) seed() uint64 {
	seed := rand.Uint64()
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			c.t.Fatalf("%s=%q: %v", SeedEnv, s, err)
		}
		seed = v
	}
	c.t.Logf("seed %d (set %s to replay)", seed, SeedEnv)
	return seed
}

func testModel(c *tcase) {
	seed := c.seed()
	m := &model{
		c:      c,
		rnd:    rand.New(rand.NewPCG(seed, 0)),
		now:    100000 * time.Hour.Microseconds(), // on the hour, as the store after align
		states: map[string]*algo.State{},
	}
	rs := modelRules(c.alg, "m")
	other := modelRules(c.other(), "o")[0]
	o := c.owner
	oa, ob := o, o
	oa.Tool, ob.Tool = "tool-a", "tool-b"
	counters := [][]limit.Check{
		{{Rule: rs[0], Key: keyspace.RateLimit(keyspace.PerTenant, rs[0].Name, o)}},
		{
			{Rule: rs[1], Key: keyspace.RateLimit(keyspace.PerTenantTool, rs[1].Name, oa)},
			{Rule: rs[1], Key: keyspace.RateLimit(keyspace.PerTenantTool, rs[1].Name, ob)},
		},
		{{Rule: rs[2], Key: keyspace.RateLimit(keyspace.PerSubject, rs[2].Name, o)}},
		{{Rule: other, Key: keyspace.RateLimit(keyspace.PerSubjectTool, other.Name, o)}},
	}
	c.align()
	for range modelOps {
		switch p := m.rnd.IntN(100); {
		case p < 60:
			m.take(m.batch(counters), m.cost())
		case p < 80:
			m.advanceSome()
		case p < 90:
			m.refund()
		default:
			m.release()
		}
		if c.t.Failed() {
			c.t.Fatalf("store and model disagree; last operations:\n%s", m.trace())
		}
		c.checkPace()
	}
	c.t.Logf("%d admitted, %d denied (%d never), %d refunds, %d releases", m.admitted, m.denied, m.never, m.refunds, m.releases)
	if m.admitted == 0 || m.denied == 0 {
		c.t.Errorf("the sequence did not both admit and deny (seed %d)", seed)
	}
}

func (m *model) batch(counters [][]limit.Check) []limit.Check {
	var b []limit.Check
	for len(b) == 0 {
		for i, alts := range counters {
			if m.rnd.IntN(10) < []int{7, 7, 4, 4}[i] {
				b = append(b, alts[m.rnd.IntN(len(alts))])
			}
		}
	}
	m.rnd.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
	return b
}

func (m *model) cost() int64 {
	switch p := m.rnd.IntN(20); {
	case p < 12:
		return 1
	case p < 16:
		return 2
	case p < 19:
		return 3
	}
	return 7 // above every capacity but concurrency's
}

func (m *model) state(key string) *algo.State {
	s := m.states[key]
	if s == nil {
		s = &algo.State{}
		m.states[key] = s
	}
	return s
}

func (m *model) log(format string, args ...any) {
	elapsed := time.Duration(m.now-100000*time.Hour.Microseconds()) * time.Microsecond
	m.history = append(m.history, fmt.Sprintf("t+%v: ", elapsed)+fmt.Sprintf(format, args...))
}

func (m *model) trace() string {
	h := m.history
	if len(h) > 20 {
		h = h[len(h)-20:]
	}
	return strings.Join(h, "\n")
}

func names(checks []limit.Check) string {
	s := make([]string, len(checks))
	for i, c := range checks {
		s[i] = c.Rule.Name
		if c.Rule.Shadow {
			s[i] += "(shadow)"
		}
		s[i] += "@" + c.Key[strings.LastIndexByte(c.Key, '}')+1:]
	}
	return strings.Join(s, ", ")
}

func (m *model) take(checks []limit.Check, cost int64) {
	c := m.c
	c.t.Helper()
	d := c.take(cost, checks...)
	results := make([]limit.Result, len(checks))
	for i, ch := range checks {
		results[i] = algo.Eval(ch.Rule, m.state(ch.Key), m.now, cost, "", false)
	}
	md := limit.Combine(checks, results, d.Lease)
	m.log("take cost %d [%s]: store allowed=%v remaining=%d rule=%s, model allowed=%v remaining=%d rule=%s",
		cost, names(checks), d.Allowed, d.Remaining, d.Rule.Name, md.Allowed, md.Remaining, md.Rule.Name)
	if d.Allowed != md.Allowed {
		c.t.Errorf("take cost %d: store Allowed=%v, model %v", cost, d.Allowed, md.Allowed)
		return
	}
	if j := indexOf(checks, d.Rule); c.h.RealTime && !md.Allowed && d.Rule != md.Rule && j >= 0 &&
		!checks[j].Rule.Shadow && !results[j].Allowed && results[j].RetryAfter == md.RetryAfter {
		// Two denials tie in the model; a real-time store sees the counters
		// a few (different) microseconds later and may break the tie the
		// other way. Either deciding rule is right.
		md.Rule, md.Limit, md.Remaining, md.ResetAfter = checks[j].Rule, limitOf(checks[j].Rule), results[j].Remaining, results[j].ResetAfter
	}
	c.expect("take", d, md.Rule, want{allowed: md.Allowed, remaining: md.Remaining, reset: md.ResetAfter, retry: md.RetryAfter})
	for i, r := range d.Results {
		w := results[i]
		c.expectResult(fmt.Sprintf("take cost %d: result %d (%s)", cost, i, checks[i].Rule.Name), r,
			want{allowed: w.Allowed, remaining: w.Remaining, reset: w.ResetAfter, retry: w.RetryAfter})
	}
	if !md.Allowed {
		m.denied++
		if md.RetryAfter == limit.Never {
			m.never++
		}
		return
	}
	m.admitted++
	a := admission{checks: checks, cost: cost, lease: d.Lease}
	for i, ch := range checks {
		algo.Eval(ch.Rule, m.state(ch.Key), m.now, cost, d.Lease, true)
		if results[i].Allowed {
			a.charged = append(a.charged, ch)
		}
	}
	m.granted = append(m.granted, a)
}

func indexOf(checks []limit.Check, r limit.Rule) int {
	for i, ch := range checks {
		if ch.Rule == r {
			return i
		}
	}
	return -1
}

// advanceSome moves the clock by a random number of whole ticks, from one
// to an hour's worth.
func (m *model) advanceSome() {
	steps := []int64{1, 3, 6, 30, 60, 90, 180, 360}[m.rnd.IntN(8)]
	m.advance(time.Duration(steps) * tick)
}

func (m *model) advance(d time.Duration) {
	m.c.advance(d)
	m.now += d.Microseconds()
	m.log("advance %v", d)
}

// refund gives back a random admitted request (the checks it charged).
func (m *model) refund() {
	if len(m.granted) == 0 {
		return
	}
	i := m.rnd.IntN(len(m.granted))
	a := m.granted[i]
	m.granted = append(m.granted[:i], m.granted[i+1:]...)
	if len(a.charged) == 0 { // admitted by shadow checks that all denied
		return
	}
	m.refunds++
	m.log("refund cost %d [%s] lease %q", a.cost, names(a.charged), a.lease)
	m.c.refund(a.cost, a.lease, a.charged...)
	for _, ch := range a.charged {
		algo.Refund(ch.Rule, m.state(ch.Key), m.now, a.cost, a.lease)
	}
}

// release ends a random admitted request (its whole batch, as a caller
// would pass it).
func (m *model) release() {
	if len(m.granted) == 0 {
		return
	}
	a := m.granted[m.rnd.IntN(len(m.granted))]
	m.releases++
	m.log("release [%s] lease %q", names(a.checks), a.lease)
	m.c.release(a.lease, a.checks...)
	for _, ch := range a.checks {
		algo.Release(ch.Rule, m.state(ch.Key), a.lease)
	}
}
