package algo

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// mustTake is Eval with commit; the test fails unless it allows.
func mustTake(t *testing.T, r limit.Rule, s *State, now, cost int64) {
	t.Helper()
	if res := Eval(r, s, now, cost, "", true); !res.Allowed {
		t.Fatalf("take of %d at %d denied: %+v", cost, now-t0, res)
	}
}

// TestRefundAtSlidingWindow proves that a sliding-window refund given its
// take's time removes that take's units, not the newest ones: a request
// admitted in between keeps its unit, and the refunded one's older unit
// cannot leave the window early and make room for one more than the limit.
// Refund (take time unknown) keeps removing the newest.
func TestRefundAtSlidingWindow(t *testing.T) {
	r := rule(limit.SlidingWindow, 2, 10*time.Second, 0)
	var s State
	mustTake(t, r, &s, t0, 1)    // A, to be refunded
	mustTake(t, r, &s, t0+s1, 1) // B
	old := clone(s)
	RefundAt(r, &s, t0+s1, t0, 1, "")
	if !slices.Equal(s.Log, []int64{t0 + s1}) {
		t.Fatalf("log after A's refund %v, want B's unit alone [%d]", s.Log, t0+s1)
	}
	mustTake(t, r, &s, t0+2*s1, 1) // C
	if res := Eval(r, &s, t0+10*s1+500*ms, 1, "", false); res.Allowed {
		t.Fatalf("D admitted at 10.5 s with B and C in the window under a limit of 2: %+v", res)
	}
	Refund(r, &old, t0+s1, 1, "")
	if !slices.Equal(old.Log, []int64{t0}) {
		t.Fatalf("Refund (take time unknown): log %v, want the newest unit removed", old.Log)
	}

	// Several units of one time and of several takes: only cost units of
	// the take's time go, whichever of them (they are interchangeable).
	r = rule(limit.SlidingWindow, 10, 10*time.Second, 0)
	s = State{}
	mustTake(t, r, &s, t0, 2)
	mustTake(t, r, &s, t0+s1, 3)
	mustTake(t, r, &s, t0+s1, 1)
	mustTake(t, r, &s, t0+2*s1, 2)
	for _, c := range []struct {
		at, cost int64
		want     []int64
	}{
		{t0 + s1, 2, []int64{t0, t0, t0 + s1, t0 + s1, t0 + 2*s1, t0 + 2*s1}},
		{t0 + s1, 5, []int64{t0, t0, t0 + 2*s1, t0 + 2*s1}},     // no more than the time holds
		{t0 + 500*ms, 1, []int64{t0, t0, t0 + 2*s1, t0 + 2*s1}}, // a time with no unit: nothing
		{t0, 1, []int64{t0, t0 + 2*s1, t0 + 2*s1}},
	} {
		RefundAt(r, &s, t0+3*s1, c.at, c.cost, "")
		if !slices.Equal(s.Log, c.want) {
			t.Fatalf("refund of %d at %d: log %v, want %v", c.cost, c.at-t0, s.Log, c.want)
		}
	}
}

// TestRefundAtWindows proves that a windowed refund given its take's time
// gives back from the take's window: a sliding window counter's previous
// count once the window turned (Refund gave nothing back then, and the
// refunded units weighed on the next window), and nothing for a window
// that no longer counts; a fixed window gives back nothing from a window
// other than the take's (Refund took it from the next window's count).
func TestRefundAtWindows(t *testing.T) {
	const p = 10 * time.Second
	swc := rule(limit.SlidingWindowCounter, 2, p, 0)
	fw := rule(limit.FixedWindow, 2, p, 0)
	a := t0 + 9900*ms // the take to refund, late in window [0, 10s)
	for _, c := range []struct {
		name  string
		r     limit.Rule
		other int64 // a take in between (0: none)
		now   int64 // the refund's time
		want  State // the state after RefundAt
		old   State // the state after Refund
	}{
		{"swc_same_window", swc, 0, a + 50*ms,
			State{}, // both windows empty: dropped
			State{}},
		{"swc_next_window", swc, 0, a + 200*ms,
			State{},
			State{Used: true, A: t0, B: 1, ExpiresAt: t0 + 20*s1}},
		{"swc_next_window_moved_on", swc, t0 + 10*s1 + 50*ms, a + 200*ms,
			State{Used: true, A: t0 + 10*s1, B: 1, C: 0, ExpiresAt: t0 + 30*s1},
			State{Used: true, A: t0 + 10*s1, B: 0, C: 1, ExpiresAt: t0 + 30*s1}},
		{"swc_window_gone", swc, t0 + 10*s1 + 50*ms, a + 10*s1 + 200*ms,
			State{Used: true, A: t0 + 10*s1, B: 1, C: 1, ExpiresAt: t0 + 30*s1},
			State{Used: true, A: t0 + 10*s1, B: 1, C: 1, ExpiresAt: t0 + 30*s1}},
		{"fw_same_window", fw, 0, a + 50*ms,
			State{},
			State{}},
		{"fw_next_window", fw, t0 + 10*s1 + 50*ms, a + 200*ms,
			State{Used: true, A: t0 + 10*s1, B: 1, ExpiresAt: t0 + 20*s1},
			State{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s State
			mustTake(t, c.r, &s, a, 1)
			if c.other != 0 {
				mustTake(t, c.r, &s, c.other, 1)
			}
			old := clone(s)
			RefundAt(c.r, &s, c.now, a, 1, "")
			if !reflect.DeepEqual(s, c.want) {
				t.Errorf("RefundAt: %+v, want %+v", s, c.want)
			}
			Refund(c.r, &old, c.now, 1, "")
			if !reflect.DeepEqual(old, c.old) {
				t.Errorf("Refund (take time unknown): %+v, want %+v", old, c.old)
			}
		})
	}

	// The review's case: A at 9.9 s refunded at 10.1 s; B and C then fit.
	var s State
	mustTake(t, swc, &s, a, 1)
	RefundAt(swc, &s, a+200*ms, a, 1, "")
	mustTake(t, swc, &s, a+200*ms, 1)
	mustTake(t, swc, &s, a+200*ms, 1)
}

// TestRefundAtUndoesTake proves, along random sequences, that refunding an
// admitted take with its take time leaves the counter counting exactly the
// takes that were not refunded, whatever was taken between the take and
// its refund and however late the refund comes: the units of every live
// take in a sliding window, the counts of the current and previous windows
// of a sliding window counter, the current window's count of a fixed
// window. The same sequences refunded with Refund (take time unknown) do
// not: the check catches the wrong units given back.
func TestRefundAtUndoesTake(t *testing.T) {
	for _, r := range []limit.Rule{
		rule(limit.SlidingWindow, 5, time.Second, 0),
		rule(limit.SlidingWindow, 20, time.Second, 0),
		rule(limit.SlidingWindowCounter, 5, time.Second, 0),
		rule(limit.SlidingWindowCounter, 20, 7*time.Millisecond, 0),
		rule(limit.FixedWindow, 5, time.Second, 0),
	} {
		t.Run(fmt.Sprintf("%s_%d_%v", r.Algorithm, r.Limit, r.Period), func(t *testing.T) {
			if msg := undoesTakes(r, RefundAt); msg != "" {
				t.Fatal(msg)
			}
			refund := func(r limit.Rule, s *State, now, _, cost int64, lease string) { Refund(r, s, now, cost, lease) }
			if undoesTakes(r, refund) == "" {
				t.Fatal("Refund passes too: the check tests nothing")
			}
		})
	}
}

// undoesTakes plays a random sequence of takes and refunds (with refund)
// on r and returns the first difference between the counter and the takes
// not refunded, or "".
func undoesTakes(r limit.Rule, refund func(r limit.Rule, s *State, now, at, cost int64, lease string)) string {
	type taken struct{ at, units int64 }
	rng := rand.New(rand.NewPCG(3, uint64(r.Limit)))
	p := r.Period.Microseconds()
	var s State
	var live []taken // admitted takes, less what was refunded
	now := t0 + rng.Int64N(p)
	refunds := 0
	for i := range 5000 {
		switch x := rng.IntN(10); {
		case x < 3: // same instant
		case x < 9:
			now += rng.Int64N(p/3 + 1)
		default:
			now += rng.Int64N(2 * p)
		}
		if len(live) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(live))
			units := 1 + rng.Int64N(live[k].units)
			refund(r, &s, now, live[k].at, units, "")
			refunds++
			if live[k].units -= units; live[k].units == 0 {
				live = slices.Delete(live, k, k+1)
			}
		} else {
			cost := 1 + rng.Int64N(r.Limit)
			if Eval(r, &s, now, cost, "", true).Allowed {
				live = append(live, taken{now, cost})
			}
		}
		ws := now - now%p
		if r.Algorithm == limit.SlidingWindow {
			var got, want []int64
			for _, tk := range live {
				for range tk.units {
					if tk.at > now-p {
						want = append(want, tk.at)
					}
				}
			}
			slices.Sort(want)
			for _, u := range s.Log {
				if u > now-p {
					got = append(got, u)
				}
			}
			if !slices.Equal(got, want) {
				return fmt.Sprintf("step %d at %d: live units %v, want %v", i, now-t0, got, want)
			}
			continue
		}
		// a window counter: the counts of the current and previous windows
		// (a fixed window has no previous one)
		var cur, prev, wcur, wprev int64
		switch {
		case s.Used && s.A == ws:
			cur, prev = s.B, s.C
		case s.Used && s.A == ws-p:
			prev = s.B
		}
		for _, tk := range live {
			switch tk.at - tk.at%p {
			case ws:
				wcur += tk.units
			case ws - p:
				wprev += tk.units
			}
		}
		if r.Algorithm == limit.FixedWindow {
			prev, wprev = 0, 0
		}
		if cur != wcur || prev != wprev {
			return fmt.Sprintf("step %d at %d: counts %d, %d (current, previous), want %d, %d: %+v",
				i, now-t0, cur, prev, wcur, wprev, s)
		}
	}
	if refunds < 100 {
		return fmt.Sprintf("%d refunds: the sequence tests nothing", refunds)
	}
	return ""
}
