package redisstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/limit"
)

// The tests in this file hold the script to package algo: every result of
// every call must equal algo.Eval's at the script's own clock (the script
// returns the time it read), and every key written must expire when algo's
// state is fresh again.

func take(cost int64, advance time.Duration) step {
	return step{op: opTakeStep, cost: cost, advance: advance}
}

func refund(cost int64) step { return step{op: opRefundStep, cost: cost} }

var release = step{op: opReleaseStep}

type scenario struct {
	name   string
	rules  []limit.Rule
	steps  []step
	denied bool // the scenario must see at least one denial
}

func scenarios() []scenario {
	const s = time.Second
	tb := rule("tb", limit.TokenBucket, 5, 10*s)
	tb.Burst = 10
	gc := rule("gc", limit.GCRA, 5, s)
	gc.Burst = 3
	odd := rule("odd", limit.GCRA, 3, 10*time.Millisecond) // interval rounds up: 3334 µs
	shadow := rule("shadow", limit.FixedWindow, 1, 10*s)
	shadow.Shadow = true
	return []scenario{
		{"fixed_window", []limit.Rule{rule("fw", limit.FixedWindow, 3, 10*s)}, []step{
			take(1, 0), take(1, 0), take(1, 0), take(1, 0), take(2, s), take(4, 0),
			take(1, 10*s), refund(1), take(2, 0), take(2, 0), refund(5), take(3, 0),
			take(1, 25*s),
		}, true},
		{"sliding_window_counter", []limit.Rule{rule("swc", limit.SlidingWindowCounter, 10, 10*s)}, []step{
			take(4, 0), take(4, 2*s), take(3, 0), take(11, 0),
			take(1, 9*s), take(5, 0), take(4, 0), take(3, 0), // prev=8 weighted
			take(6, 4*s), take(2, 3*s), refund(2), take(3, 0),
			take(1, 11*s), take(9, 0), take(1, 30*s),
		}, true},
		{"token_bucket", []limit.Rule{tb}, []step{
			take(10, 0), take(1, 0), take(1, 2*s), take(2, 0), refund(3), take(3, 0),
			take(11, 0), take(5, 7*s), take(1, 20*s), refund(1), refund(100),
		}, true},
		{"gcra", []limit.Rule{gc}, []step{
			take(1, 0), take(1, 0), take(1, 0), take(1, 0), take(1, 200*time.Millisecond),
			refund(1), take(2, 0), take(4, 0), take(3, 5*s), refund(5), take(3, 0),
		}, true},
		{"gcra_odd_interval", []limit.Rule{odd}, []step{
			take(2, 0), take(2, 0), take(1, 3*time.Millisecond), take(3, 20*time.Millisecond), take(1, 0),
		}, true},
		{"sliding_window", []limit.Rule{rule("sw", limit.SlidingWindow, 4, 10*s)}, []step{
			take(1, 0), take(2, s), take(1, 0), take(1, 0), take(2, 0), take(5, 0),
			refund(2), take(1, 0), take(2, 0), take(1, 8500*time.Millisecond), take(1, s),
			take(3, 0), refund(1), take(1, 0), take(4, 20*s), take(1, 0),
		}, true},
		{"concurrency", []limit.Rule{rule("cc", limit.Concurrency, 2, 5*s)}, []step{
			take(1, 0), take(7, 0), take(1, 0), release, take(1, 0), release, release,
			take(1, 2*s), take(1, 0), take(1, 4*s), refund(1), take(1, 0), take(1, 6*s),
		}, true},
		{"all_or_nothing", []limit.Rule{
			rule("fw", limit.FixedWindow, 5, 10*s), rule("tb2", limit.TokenBucket, 2, 10*s),
			rule("sw", limit.SlidingWindow, 5, 10*s), rule("cc", limit.Concurrency, 5, 10*s),
			rule("swc", limit.SlidingWindowCounter, 5, 10*s), gc,
		}, []step{
			take(1, 0), take(1, 0), take(1, 0), take(1, 0), take(1, 5*s), take(1, 0),
			take(1, 0), refund(1), take(1, 0), release, take(3, 10*s), take(2, 0),
		}, true},
		{"shadow", []limit.Rule{rule("fw", limit.FixedWindow, 3, 10*s), shadow}, []step{
			take(1, 0), take(1, 0), take(1, 0), take(1, 0), take(5, 0), take(1, 10*s),
		}, true},
		// the server clock steps back 3 s into the window before (a
		// failover to a lagging replica), then runs on: decisions stay on
		// the counter's time, retry and reset count the gap
		{"fixed_window_step_back", []limit.Rule{rule("fw", limit.FixedWindow, 3, 10*s)}, []step{
			take(2, 0), take(1, -3*s), take(1, 0), take(2, 3*s), take(1, 9999*time.Millisecond),
			take(1, -500*time.Millisecond), take(2, 0), take(1, 600*time.Millisecond), take(1, 0), take(1, 10*s),
		}, true},
		{"sliding_window_counter_step_back", []limit.Rule{rule("swc", limit.SlidingWindowCounter, 5, 10*s)}, []step{
			take(3, 0), take(2, -3*s), take(1, 0), take(1, 7*s), take(1, 5*s),
			take(1, -3*s), take(2, 4*s), take(1, 0), take(1, 2*s), take(4, 20*s),
		}, true},
		{"token_bucket_step_back", []limit.Rule{tb}, []step{
			take(8, 0), take(2, -3*s), take(1, 0), take(1, 4*s), take(1, 1500*time.Millisecond),
			take(1, -2*s), refund(1), take(1, 0), take(11, 0), take(2, 6*s), take(10, 20*s),
		}, true},
		{"sliding_window_step_back", []limit.Rule{rule("sw", limit.SlidingWindow, 4, 10*s)}, []step{
			take(2, 0), take(1, -1*s), take(1, 0), take(1, 0), take(1, 2*s),
			take(1, -3*s), take(2, 9*s), take(1, 0), take(1, 1500*time.Millisecond), take(3, 20*s),
		}, true},
		// units taken before a 5 s step back stay in the window 5 s longer
		// than one period from the stepped-back clock: the key must too
		{"sliding_window_step_back_keeps_later_units", []limit.Rule{rule("sw", limit.SlidingWindow, 4, 10*s)}, []step{
			take(3, 0), take(1, -5*s), take(2, 11*s), take(1, 0), take(1, 5*s),
		}, true},
		// a refund that leaves a counter fresh (a full bucket, an empty
		// window, a TAT not ahead of now) deletes it, in the script as in
		// algo, before the clock steps back...
		{"token_bucket_refund_full_step_back", []limit.Rule{tb}, []step{
			take(1, 0), refund(1), take(10, -3*s), take(1, 2*s), take(1, 0),
		}, true},
		{"fixed_window_refund_empty_step_back", []limit.Rule{rule("fw", limit.FixedWindow, 3, 10*s)}, []step{
			take(1, s), refund(1), take(3, -2*s), take(1, 1500*time.Millisecond), take(1, s), take(3, 0),
		}, true},
		{"sliding_window_counter_refund_empty_step_back", []limit.Rule{rule("swc", limit.SlidingWindowCounter, 3, 10*s)}, []step{
			take(1, s), refund(1), take(3, -2*s), take(1, 1500*time.Millisecond), take(1, s),
		}, true},
		{"gcra_refund_fresh_step_back", []limit.Rule{gc}, []step{
			take(1, 0), refund(1), take(3, -300*time.Millisecond), take(1, 0), take(1, 200*time.Millisecond),
		}, true},
		// ...but a bucket refilled to full at its own time, ahead of the
		// clock that stepped back, keeps that time until the clock catches
		// up: deleted, the stepped-back interval would be refilled twice
		{"token_bucket_step_back_refund_full", []limit.Rule{tb}, []step{
			take(3, 0), take(1, -3*s), refund(4), take(10, 0), take(1, 2*s), take(1, 4*s),
		}, true},
		{"cost_above_capacity", []limit.Rule{tb, gc, rule("sw", limit.SlidingWindow, 4, 10*s), rule("fw", limit.FixedWindow, 20, 10*s)}, []step{
			take(11, 0), take(4, 0), take(3, 0),
		}, true},
	}
}

func TestMatchesAlgoScenarios(t *testing.T) {
	_, c, s := startStore(t)
	for i, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			align(t, c, s, 10*time.Second)
			r := newRunner(t, c, s, tenantChecks(fmt.Sprintf("scenario-%d", i), sc.rules...))
			r.run(sc.steps...)
			if sc.denied && r.denied+r.never == 0 {
				t.Errorf("no denial seen (%v): the scenario does not test what it says", r)
			}
			t.Log(r)
		})
	}
	if n := allKeysExpire(t, c); n == 0 {
		t.Error("no keys left to check for TTLs")
	}
}

// TestMatchesAlgoReload changes a rule under the same key, as a config
// reload does: a lower limit, another algorithm.
func TestMatchesAlgoReload(t *testing.T) {
	_, c, s := startStore(t)
	const p = 10 * time.Second
	at := func(a limit.Algorithm, lim int64) []limit.Check {
		return tenantChecks("reload", rule("r", a, lim, p))
	}
	align(t, c, s, p)
	r := newRunner(t, c, s, at(limit.FixedWindow, 10))
	r.run(take(6, 0))
	for _, st := range []step{
		{checks: at(limit.FixedWindow, 3)},          // above the lowered limit
		{checks: at(limit.SlidingWindowCounter, 8)}, // reads the fixed state
		{checks: at(limit.TokenBucket, 4)},
		{checks: at(limit.GCRA, 4), cost: 2},
		{checks: at(limit.SlidingWindow, 4)}, // a string where a sorted set goes
		{checks: at(limit.SlidingWindow, 4)},
		{checks: at(limit.FixedWindow, 4)}, // a sorted set where a string goes
		{checks: at(limit.GCRA, 100), cost: 50},
		{checks: at(limit.GCRA, 2)}, // TAT far ahead of the new tau
		{checks: at(limit.Concurrency, 3)},
		{checks: at(limit.TokenBucket, 3), op: opRefundStep},
	} {
		r.do(st)
	}
	allKeysExpire(t, c)
}

// TestMatchesAlgoRandom plays long random sequences for every algorithm, and
// for mixed batches with a shadow rule, with random costs and clock jumps.
func TestMatchesAlgoRandom(t *testing.T) {
	_, c, s := startStore(t)
	matchRandom(t, c, s, 1000, false)
}

// TestMatchesAlgoRandomStepBack is TestMatchesAlgoRandom with the server
// clock sometimes stepping back, up to a period (an NTP step, a failover
// to a replica whose clock lags): the counters' times ahead of the clock,
// the gaps in the waits, units logged behind later ones, refunds of
// counters ahead of the clock.
func TestMatchesAlgoRandomStepBack(t *testing.T) {
	_, c, s := startStore(t)
	matchRandom(t, c, s, 1000, true)
}

// matchRandom plays steps random calls on each of a set of rule batches
// against algo; with stepBack, 7% of the steps move the clock back.
func matchRandom(t *testing.T, c rueidis.Client, s *Store, steps int, stepBack bool) {
	ms := time.Millisecond
	tb := rule("tb", limit.TokenBucket, 3, 2*time.Second)
	tb.Burst = 5
	gc := rule("gc", limit.GCRA, 7, time.Second)
	gc.Burst = 4
	shadow := rule("sh", limit.SlidingWindow, 2, time.Second)
	shadow.Shadow = true
	configs := [][]limit.Rule{
		{rule("fw", limit.FixedWindow, 4, time.Second)},
		{rule("swc", limit.SlidingWindowCounter, 5, time.Second)},
		{rule("swc3", limit.SlidingWindowCounter, 3, 7*ms)},
		{tb},
		{gc},
		{rule("gc3", limit.GCRA, 3, 10*ms)},
		{rule("sw", limit.SlidingWindow, 4, time.Second)},
		{rule("cc", limit.Concurrency, 3, time.Second)},
		{rule("fw", limit.FixedWindow, 6, time.Second), tb, gc, rule("sw", limit.SlidingWindow, 5, time.Second),
			rule("cc", limit.Concurrency, 2, time.Second), rule("swc", limit.SlidingWindowCounter, 6, time.Second), shadow},
	}
	for i, rules := range configs {
		if stepBack && slices.ContainsFunc(rules, func(r limit.Rule) bool { return r.Period < time.Second }) {
			// Redis expires keys in real time, while the test moves only
			// the script's clock: a key of a period of milliseconds
			// expires during the run, and a step back then finds it gone
			// where algo's state still counts.
			continue
		}
		name := string(rules[0].Algorithm)
		if len(rules) > 1 {
			name = "mixed"
		}
		t.Run(fmt.Sprintf("%d_%s", i, name), func(t *testing.T) {
			seed := uint64(42)
			if stepBack {
				seed = 7
			}
			rng := rand.New(rand.NewPCG(uint64(i), seed))
			checks := tenantChecks(fmt.Sprintf("random-%d", i), rules...)
			capacity := checks[0].Rule.Capacity()
			p := checks[0].Rule.Period
			r := newRunner(t, c, s, checks)
			for range steps {
				var st step
				switch x := rng.IntN(100); {
				case x < 40:
				case x < 70:
					st.advance = time.Duration(rng.Int64N(int64(p / 4)))
				case x < 90:
					st.advance = time.Duration(rng.Int64N(int64(p)))
				case stepBack && x < 97:
					st.advance = -time.Duration(rng.Int64N(int64(p)))
				default:
					st.advance = time.Duration(rng.Int64N(int64(3 * p)))
				}
				st.advance = st.advance.Truncate(time.Microsecond)
				switch x := rng.IntN(100); {
				case x < 8:
					st.op = opRefundStep
				case x < 14:
					st.op = opReleaseStep
				}
				st.cost = 1 + rng.Int64N(2)
				if rng.IntN(10) == 0 {
					st.cost = 1 + rng.Int64N(capacity+1) // sometimes above capacity
				}
				r.do(st)
			}
			if r.allowed == 0 || r.denied == 0 {
				t.Errorf("%v: want both admissions and denials", r)
			}
			t.Log(r)
		})
	}
	allKeysExpire(t, c)
}
