package algo

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

var testParams = BreakerParams{Denials: 2, Failures: 2, Identical: 3, IdenticalWithin: 100, Cooldown: 10, MaxCooldown: 35, ProbeLease: 4}

func TestParams(t *testing.T) {
	spec := limit.BreakerSpec{ConsecutiveDenials: 1, ConsecutiveFailures: 2, IdenticalCount: 3, IdenticalWithin: time.Second,
		Cooldown: time.Millisecond, MaxCooldown: 2 * time.Millisecond, ProbeLease: 3 * time.Millisecond}
	if p := Params(spec); p != (BreakerParams{Denials: 1, Failures: 2, Cooldown: 1000, MaxCooldown: 2000, ProbeLease: 3000}) {
		t.Errorf("without an identical key: %+v, want no identical trigger", p)
	}
	spec.IdenticalKey = "k"
	if p := Params(spec); p.Identical != 3 || p.IdenticalWithin != 1_000_000 {
		t.Errorf("with an identical key: %+v", p)
	}
}

// TestBreakerLife walks a breaker through every transition.
func TestBreakerLife(t *testing.T) {
	p := testParams
	var b Breaker
	var calls CallCounter
	after := func(now int64, v Verdict, probe bool) (bool, bool) {
		return BreakerAfter(&b, p, now, v, probe, &calls, "ck")
	}
	if deny, _, probe := BreakerGate(&b, p, 0); deny || probe {
		t.Fatal("a closed breaker gated a call")
	}
	// identical calls: window anchored at the first, counted only when admitted
	for i, st := range []struct {
		now     int64
		v       Verdict
		counted bool
		n       int64
	}{{0, Admitted, true, 1}, {50, Denied, false, 1}, {60, Unjudged, false, 1}, {99, Admitted, true, 2}, {100, Admitted, true, 1}} {
		if opened, counted := after(st.now, st.v, false); opened || counted != st.counted || calls.N != st.n {
			t.Fatalf("call %d: opened %v counted %v count %d, want %v %d", i, opened, counted, calls.N, st.counted, st.n)
		}
	}
	if calls.ExpiresAt != 200 || b.Denials != 0 {
		t.Fatalf("counter %+v, denials %d", calls, b.Denials)
	}
	after(101, Admitted, false)
	if opened, _ := after(102, Admitted, false); !opened || b.Phase != Open || b.Reason != limit.ReasonIdentical || b.Until != 112 || b.CallKey != "ck" || b.Calls != 3 {
		t.Fatalf("third identical call: %+v", b)
	}
	if got := BreakerExpiry(&b, p, 102); got != 112+35 {
		t.Errorf("expiry of an open breaker %d", got)
	}
	if deny, retry, _ := BreakerGate(&b, p, 111); !deny || retry != 1 {
		t.Fatalf("gate before until: %v %d", deny, retry)
	}
	// half-open: one probe, whose denial frees the lease
	if deny, _, probe := BreakerGate(&b, p, 112); deny || !probe || b.Phase != HalfOpen || b.ProbeUntil != 116 {
		t.Fatalf("gate at until: %v %v %+v", deny, probe, b)
	}
	if got := BreakerExpiry(&b, p, 112); got != 116+35 {
		t.Errorf("expiry of a half-open breaker %d", got)
	}
	if deny, retry, _ := BreakerGate(&b, p, 113); !deny || retry != 3 {
		t.Fatalf("gate with a probe in flight: %v %d", deny, retry)
	}
	if opened, counted := after(113, Denied, true); opened || counted || b.ProbeUntil != 113 || b.Denials != 0 {
		t.Fatalf("denied probe: %+v", b)
	}
	if deny, _, probe := BreakerGate(&b, p, 113); deny || !probe {
		t.Fatal("no probe after a denied one")
	}
	// failed probes double the cooldown up to the cap
	for _, cd := range []int64{20, 35, 35} {
		if !BreakerReport(&b, p, 120, true, true) || b.Phase != Open || b.Cooldown != cd || b.Until != 120+cd || b.Reason != limit.ReasonProbeFailed {
			t.Fatalf("failed probe: %+v, want cooldown %d", b, cd)
		}
		BreakerGate(&b, p, b.Until)
	}
	// a non-probe report on a half-open breaker only counts
	f := b.Failures
	if BreakerReport(&b, p, 200, true, false) || b.Phase != HalfOpen || b.Failures != f+1 {
		t.Fatalf("late failure: %+v", b)
	}
	if BreakerAddDenials(&b, p, 200, 5) || b.Phase != HalfOpen || b.Denials != 5 {
		t.Fatalf("denials on a half-open breaker: %+v", b)
	}
	if BreakerReport(&b, p, 200, false, true) || b != (Breaker{}) {
		t.Fatalf("successful probe: %+v, want closed with nothing", b)
	}
	if BreakerExpiry(&b, p, 200) != 0 {
		t.Error("a closed breaker without counts expires")
	}
	// failures and denials
	if BreakerReport(&b, p, 200, true, false) || BreakerExpiry(&b, p, 200) != 235 {
		t.Fatalf("one failure: %+v", b)
	}
	if !BreakerReport(&b, p, 201, true, false) || b.Reason != limit.ReasonFailures || b.Until != 211 || b.Cooldown != 10 {
		t.Fatalf("second failure: %+v", b)
	}
	b = Breaker{}
	if BreakerAddDenials(&b, p, 300, 1) {
		t.Fatal("one denial opened")
	}
	if opened, _ := after(301, Denied, false); !opened || b.Reason != limit.ReasonDenials || b.Denials != 2 {
		t.Fatalf("second denial: %+v", b)
	}
	if blocked, retry := BreakerBlocking(&b, 301); !blocked || retry != 10 {
		t.Errorf("blocking: %v %d", blocked, retry)
	}
	st := BreakerView(&b, p, 301, true)
	if st.RetryAfter != 10*time.Microsecond || st.Cooldown != 10*time.Microsecond || st.Reason != limit.ReasonDenials || st.Denials != 2 {
		t.Errorf("view: %+v", st)
	}
	info, ok := BreakerInfo("k", &b, func(us int64) time.Time { return time.UnixMicro(us) })
	if !ok || info.Until != time.UnixMicro(311) || info.HalfOpen || info.Key != "k" {
		t.Errorf("info: %+v %v", info, ok)
	}
	if _, ok := BreakerInfo("k", &Breaker{Denials: 1}, nil); ok {
		t.Error("a closed breaker is listed")
	}
}

func TestGuardedDecision(t *testing.T) {
	r := limit.Rule{Name: "r", Algorithm: limit.FixedWindow, Limit: 5, Period: time.Second}
	checks := []limit.Check{{Rule: r, Key: "k"}}
	ok := []limit.Result{{Allowed: true, Remaining: 4}}
	m := &limit.Meter{Key: "m"}
	for _, tc := range []struct {
		name    string
		req     limit.Request
		results []limit.Result
		meterOK bool
		gated   bool
		allowed bool
		rule    string
	}{
		{"gated", limit.Request{Checks: checks}, make([]limit.Result, 1), true, true, false, ""},
		{"breaker alone", limit.Request{}, []limit.Result{}, false, false, true, ""},
		{"checks", limit.Request{Checks: checks}, ok, false, false, true, "r"},
		{"meter denies", limit.Request{Checks: checks, Meter: m}, ok, false, false, false, ""},
		{"meter admits", limit.Request{Checks: checks, Meter: m}, ok, true, false, true, "r"},
	} {
		d := GuardedDecision(tc.req, tc.results, "", tc.meterOK, tc.gated)
		if d.Allowed != tc.allowed || d.Rule.Name != tc.rule || len(d.Results) != len(tc.results) || d.Results == nil {
			t.Errorf("%s: %+v", tc.name, d)
		}
	}
}

// TestBreakerReleaseProbe: only a probe in flight is released, and a call
// refused because of it is HalfOpen.
func TestBreakerReleaseProbe(t *testing.T) {
	p := testParams
	b := Breaker{Phase: Open, Until: 10, Cooldown: p.Cooldown}
	var st limit.BreakerState
	BreakerBlocked(&st, &b, 5)
	if !st.Open || st.HalfOpen || st.RetryAfter != dur(5) {
		t.Errorf("open: %+v", st)
	}
	if BreakerReleaseProbe(&b, 5) || b != (Breaker{Phase: Open, Until: 10, Cooldown: p.Cooldown}) {
		t.Errorf("an open breaker was released: %+v", b)
	}
	if deny, _, probe := BreakerGate(&b, p, 10); deny || !probe || b.ProbeUntil != 14 {
		t.Fatalf("gate at the end of the cooldown: deny %v probe %v, %+v", deny, probe, b)
	}
	BreakerBlocked(&st, &b, 11)
	if !st.Open || !st.HalfOpen || st.RetryAfter != dur(3) {
		t.Errorf("probe in flight: %+v, want Open and HalfOpen for the rest of the lease", st)
	}
	if !BreakerReleaseProbe(&b, 11) || b.ProbeUntil != 11 || b.Phase != HalfOpen {
		t.Fatalf("release of the probe in flight: %+v", b)
	}
	if BreakerReleaseProbe(&b, 11) {
		t.Error("a released probe was released again")
	}
	BreakerBlocked(&st, &b, 11)
	if st.Open || st.HalfOpen || st.RetryAfter != 0 {
		t.Errorf("after the release: %+v, want not blocked", st)
	}
	if deny, _, probe := BreakerGate(&b, p, 11); deny || !probe {
		t.Errorf("after the release the next call is not the probe: deny %v probe %v", deny, probe)
	}
	var closed Breaker
	if BreakerReleaseProbe(&closed, 11) || closed != (Breaker{}) {
		t.Errorf("a closed breaker was released: %+v", closed)
	}
}
