package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// The undo of a split request (layered.go) refunds a half one round trip
// after its take. Whatever another request did on the counter meanwhile,
// the refund must give back the units that take charged: the tests below
// refund the way split does, with refundAt and the take's own clock.

// timedTaker is taker returning the take's clock too (the script's "now",
// which split passes to refundAt).
func timedTaker(tb testing.TB, ctx context.Context, s *Store, checks []limit.Check) func() (limit.Decision, int64) {
	return func() (limit.Decision, int64) {
		tb.Helper()
		res, lease, now, err := s.take(ctx, checks, 1)
		if err != nil {
			tb.Fatal(err)
		}
		return limit.Combine(checks, res, lease), now
	}
}

// TestRefundAtSlidingWindowKeepsLaterUnit proves that a sliding-window
// refund removes the refunded take's unit, not the newest one: request B,
// admitted between A's take and A's refund, keeps its unit, and A's unit is
// gone, so no more than the limit ever fits in one window. (Removing the
// newest unit instead left A's older unit to leave the window early: D
// fitted as a third unit under a limit of 2.)
func TestRefundAtSlidingWindowKeepsLaterUnit(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	checks := tenantChecks("acme", rule("sw", limit.SlidingWindow, 2, 10*time.Second))
	take := taker(t, ctx, s, checks)
	align(t, c, s, 10*time.Second)
	d, aNow := timedTaker(t, ctx, s, checks)() // A at 0 s, to be refunded
	if !d.Allowed {
		t.Fatal("A denied")
	}
	s.offset.Add(time.Second.Microseconds())
	if d := take(); !d.Allowed { // B at 1 s
		t.Fatal("B denied")
	}
	if _, err := s.refundAt(ctx, checks, 1, "", aNow); err != nil { // A's undo, as split sends it
		t.Fatal(err)
	}
	s.offset.Add(time.Second.Microseconds())
	if d := take(); !d.Allowed { // C at 2 s
		t.Fatal("C denied")
	}
	s.offset.Add(8500 * time.Millisecond.Microseconds())
	if d := take(); d.Allowed { // B and C are still in the window
		t.Fatal("D admitted at 10.5 s: 3 units in the window under a limit of 2")
	}
}

// TestRefundAtSlidingWindowCounterNextWindow proves that a
// sliding-window-counter refund that lands in the window after its take's
// gives the units back from the previous window's count: the refunded
// request no longer weighs on the new window, and the full limit is
// available there. (A refund that only looked at the current window gave
// back nothing, and C was denied.)
func TestRefundAtSlidingWindowCounterNextWindow(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	checks := tenantChecks("acme", rule("swc", limit.SlidingWindowCounter, 2, 10*time.Second))
	take := taker(t, ctx, s, checks)
	align(t, c, s, 10*time.Second)
	s.offset.Add(9900 * time.Millisecond.Microseconds())
	d, aNow := timedTaker(t, ctx, s, checks)() // A at 9.9 s, to be refunded
	if !d.Allowed {
		t.Fatal("A denied")
	}
	s.offset.Add(200 * time.Millisecond.Microseconds())
	if _, err := s.refundAt(ctx, checks, 1, "", aNow); err != nil { // lands in the next window
		t.Fatal(err)
	}
	if d := take(); !d.Allowed {
		t.Fatal("B denied")
	}
	if d := take(); !d.Allowed {
		t.Fatalf("C denied (remaining %d): the refunded A still counts", d.Remaining)
	}
}

// TestClusterSplitUndoRefundsTakenUnit proves that split passes each
// half's own take time to the refund that undoes it, for the tenant half
// (the global rule denies) and for the global half (a tenant rule denies).
// The half's sliding-window counter already holds a unit newer than the
// take's (the first request, taken a second later on the store's clock,
// stands for a request admitted between the take and its undo): the undo
// must remove the take's unit and keep that one.
func TestClusterSplitUndoRefundsTakenUnit(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	c := cl.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	id := fmt.Sprint(time.Now().UnixNano())
	global := func(r limit.Rule) limit.Check {
		r.Name += "-" + id
		return limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerGlobal, r.Name, keyspace.Owner{})}
	}
	// members returns the sorted set at key, member -> score.
	members := func(key string) map[string]float64 {
		t.Helper()
		zs, err := c.Do(ctx, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for _, z := range zs {
			m[z.Member] = z.Score
		}
		return m
	}
	for _, tc := range []struct {
		name           string
		tenant, global limit.Rule
		undone         func(checks, global []limit.Check) string // the key of the sliding window undone
	}{
		{"tenant_half", rule("sw", limit.SlidingWindow, 10, time.Hour), rule("fw", limit.FixedWindow, 1, time.Hour),
			func(checks, _ []limit.Check) string { return checks[0].Key }},
		{"global_half", rule("fw", limit.FixedWindow, 1, time.Hour), rule("sw", limit.SlidingWindow, 10, time.Hour),
			func(_, global []limit.Check) string { return global[0].Key }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := tenantChecks("split-"+tc.name+"-"+id, tc.tenant)
			globals := []limit.Check{global(tc.global)}
			if keyspace.Slot(globals[0].Key) == keyspace.Slot(checks[0].Key) {
				t.Fatal("the global key shares the tenant's slot: no split, the test proves nothing")
			}
			key := tc.undone(checks, globals)
			req := limit.Request{Checks: checks, Global: globals, Cost: 1}
			align(t, c, s, time.Hour)
			s.offset.Add(time.Second.Microseconds())
			o, err := s.Evaluate(ctx, req) // admitted: spends the fixed window, a unit at 1 s
			if err != nil || !o.Decision.Allowed {
				t.Fatalf("first request: %+v, %v; want admitted", o.Decision, err)
			}
			later := members(key)
			if len(later) != 1 {
				t.Fatalf("after the first request %s holds %v, want one unit", key, later)
			}
			s.offset.Add(-time.Second.Microseconds())
			o, err = s.Evaluate(ctx, req) // at 0 s: the fixed window denies, the other half is undone
			if err != nil || o.Decision.Allowed {
				t.Fatalf("second request: %+v, %v; want denied", o.Decision, err)
			}
			if got := members(key); fmt.Sprint(got) != fmt.Sprint(later) {
				t.Fatalf("after the undo %s holds %v, want the first request's unit alone %v", key, got, later)
			}
		})
	}
}

// TestMatchesAlgoRefundAt holds the refund with a take time (op 'r' with
// its optional last argument) to algo.RefundAt: random takes, clock jumps
// and refunds of a random earlier take, at its time (or at a time no take
// had, or with no time), and every later result must equal algo's.
func TestMatchesAlgoRefundAt(t *testing.T) {
	_, c, s := startStore(t)
	ms := time.Millisecond
	tb := rule("tb", limit.TokenBucket, 3, 2*time.Second)
	tb.Burst = 5
	gc := rule("gc", limit.GCRA, 7, time.Second)
	shadow := rule("sh", limit.SlidingWindow, 2, time.Second)
	shadow.Shadow = true
	configs := [][]limit.Rule{
		{rule("sw", limit.SlidingWindow, 4, time.Second)},
		{rule("sw7", limit.SlidingWindow, 7, 7*ms)},
		{rule("swc", limit.SlidingWindowCounter, 5, time.Second)},
		{rule("swc3", limit.SlidingWindowCounter, 3, 7*ms)},
		{rule("fw", limit.FixedWindow, 4, time.Second)},
		{rule("fw", limit.FixedWindow, 6, time.Second), tb, gc, rule("sw", limit.SlidingWindow, 5, time.Second),
			rule("cc", limit.Concurrency, 2, time.Second), rule("swc", limit.SlidingWindowCounter, 6, time.Second), shadow},
	}
	for i, rules := range configs {
		name := string(rules[0].Algorithm)
		if len(rules) > 1 {
			name = "mixed"
		}
		t.Run(fmt.Sprintf("%d_%s", i, name), func(t *testing.T) {
			ctx := ctxT(t)
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			checks := tenantChecks(fmt.Sprintf("refundat-%d", i), rules...)
			p := checks[0].Rule.Period
			m := newModel()
			r := newRunner(t, c, s, checks) // for its TTL check
			var takes []int64               // times of the admitted takes
			var lease string
			refunds, tries := 0, 0
			for n := range 600 {
				r.n = n + 1
				switch x := rng.IntN(100); {
				case x < 40:
				case x < 80:
					s.offset.Add(rng.Int64N(p.Microseconds() / 4))
				case x < 95:
					s.offset.Add(rng.Int64N(p.Microseconds()))
				default:
					s.offset.Add(rng.Int64N(3 * p.Microseconds()))
				}
				cost := 1 + rng.Int64N(2)
				if len(takes) > 0 && rng.IntN(4) == 0 {
					at := takes[len(takes)-1-rng.IntN(min(len(takes), 5))]
					switch rng.IntN(10) {
					case 0:
						at = -1 // unknown: Refund
					case 1:
						at++ // no take at that time
					}
					now, err := s.refundAt(ctx, checks, cost, lease, at)
					if err != nil {
						t.Fatalf("step %d: refund at %d: %v", r.n, at, err)
					}
					for _, ch := range checks {
						algo.RefundAt(ch.Rule, m.state(ch.Key), now, at, cost, lease)
					}
					refunds++
					continue
				}
				began := time.Now()
				got, l, now, err := s.take(ctx, checks, cost)
				if err != nil {
					t.Fatalf("step %d: take: %v", r.n, err)
				}
				want := m.take(checks, now, cost, l)
				tries++
				for k := range want {
					if !reflect.DeepEqual(got[k], want[k]) {
						t.Fatalf("step %d: take(cost %d) at %d, check %d (%s):\n got  %+v\n want %+v",
							r.n, cost, now, k, checks[k].Rule.Algorithm, got[k], want[k])
					}
				}
				if d := limit.Combine(checks, got, l); d.Allowed {
					takes = append(takes, now)
					if l != "" {
						lease = l
					}
					for k, ch := range checks {
						if got[k].Allowed {
							r.checkTTL(ch.Key, m.state(ch.Key).ExpiresAt-now, began)
						}
					}
				}
			}
			if refunds < 50 || len(takes) < 50 || len(takes) == tries {
				t.Fatalf("%d refunds, %d of %d takes admitted: the sequence tests little", refunds, len(takes), tries)
			}
		})
	}
	allKeysExpire(t, c)
}
