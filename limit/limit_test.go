package limit

import (
	"errors"
	"testing"
	"time"
)

func TestRuleValidate(t *testing.T) {
	ok := Rule{Name: "r", Algorithm: TokenBucket, Limit: 10, Period: time.Minute}
	tests := []struct {
		name string
		edit func(*Rule)
		ok   bool
	}{
		{"valid", func(*Rule) {}, true},
		{"burst above limit", func(r *Rule) { r.Burst = 100 }, true},
		{"no name", func(r *Rule) { r.Name = "" }, false},
		{"unknown algorithm", func(r *Rule) { r.Algorithm = "lru" }, false},
		{"zero limit", func(r *Rule) { r.Limit = 0 }, false},
		{"negative burst", func(r *Rule) { r.Burst = -1 }, false},
		{"period too short", func(r *Rule) { r.Period = time.Microsecond * 999 }, false},
		{"period too long", func(r *Rule) { r.Period = MaxPeriod + time.Hour }, false},
		{"sub-microsecond period", func(r *Rule) { r.Period = time.Second + 1 }, false},
		{"capacity times period too large", func(r *Rule) { r.Burst = 1 << 40 }, false},
		{"limit times period too large", func(r *Rule) { r.Algorithm = FixedWindow; r.Limit = 1 << 40 }, false},
		{"huge sliding window", func(r *Rule) { r.Algorithm = SlidingWindow; r.Limit = MaxSlidingWindowLimit + 1 }, false},
		{"largest sliding window", func(r *Rule) { r.Algorithm = SlidingWindow; r.Limit = MaxSlidingWindowLimit }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			err := r.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidRule) {
				t.Fatalf("error %v does not wrap ErrInvalidRule", err)
			}
		})
	}
}

func TestCapacity(t *testing.T) {
	for _, tt := range []struct {
		r    Rule
		want int64
	}{
		{Rule{Algorithm: TokenBucket, Limit: 10, Burst: 20}, 20},
		{Rule{Algorithm: GCRA, Limit: 10}, 10},
		{Rule{Algorithm: FixedWindow, Limit: 10, Burst: 20}, 10},
		{Rule{Algorithm: Concurrency, Limit: 3}, 3},
	} {
		if got := tt.r.Capacity(); got != tt.want {
			t.Errorf("%s limit %d burst %d: Capacity() = %d, want %d", tt.r.Algorithm, tt.r.Limit, tt.r.Burst, got, tt.want)
		}
	}
}

func TestValidateBatch(t *testing.T) {
	r := Rule{Name: "r", Algorithm: FixedWindow, Limit: 1, Period: time.Second}
	c := Check{Rule: r, Key: "k"}
	for _, tt := range []struct {
		name   string
		checks []Check
		cost   int64
		want   error
	}{
		{"ok", []Check{c}, 1, nil},
		{"empty", nil, 1, ErrNoChecks},
		{"zero cost", []Check{c}, 0, ErrInvalidCost},
		{"empty key", []Check{{Rule: r}}, 1, ErrInvalidRule},
		{"duplicate key", []Check{c, c}, 1, ErrDuplicateKey},
		{"invalid rule", []Check{{Rule: Rule{Name: "x"}, Key: "k"}}, 1, ErrInvalidRule},
	} {
		err := Validate(tt.checks, tt.cost)
		if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("%s: Validate = %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestCombine(t *testing.T) {
	rule := func(name string, alg Algorithm, shadow bool) Check {
		return Check{Rule: Rule{Name: name, Algorithm: alg, Limit: 10, Burst: 20, Period: time.Minute, Shadow: shadow}, Key: name}
	}
	allow := func(rem int64) Result { return Result{Allowed: true, Remaining: rem, ResetAfter: time.Second} }
	deny := func(retry time.Duration) Result {
		return Result{Remaining: 0, ResetAfter: time.Minute, RetryAfter: retry}
	}
	tests := []struct {
		name      string
		checks    []Check
		results   []Result
		allowed   bool
		rule      string
		limit     int64
		remaining int64
		retry     time.Duration
		lease     string
	}{
		{"all allow: least remaining decides", []Check{rule("a", FixedWindow, false), rule("b", FixedWindow, false)},
			[]Result{allow(5), allow(2)}, true, "b", 10, 2, 0, ""},
		{"token bucket reports its burst as the limit", []Check{rule("tb", TokenBucket, false)},
			[]Result{allow(7)}, true, "tb", 20, 7, 0, ""},
		{"longest retry among denials decides", []Check{rule("a", FixedWindow, false), rule("b", FixedWindow, false), rule("c", FixedWindow, false)},
			[]Result{deny(time.Second), allow(9), deny(time.Minute)}, false, "c", 10, 0, time.Minute, ""},
		{"never beats any retry", []Check{rule("a", FixedWindow, false), rule("b", FixedWindow, false)},
			[]Result{deny(Never), deny(time.Hour)}, false, "a", 10, 0, Never, ""},
		{"shadow denial does not deny", []Check{rule("s", FixedWindow, true), rule("a", FixedWindow, false)},
			[]Result{deny(time.Second), allow(3)}, true, "a", 10, 3, 0, ""},
		{"only shadow rules: reported, admitted", []Check{rule("s", FixedWindow, true)},
			[]Result{deny(time.Second)}, true, "s", 10, 0, 0, ""},
		{"lease kept when a slot was taken", []Check{rule("c", Concurrency, false)},
			[]Result{allow(1)}, true, "c", 10, 1, 0, "L"},
		{"lease dropped when the only slot rule is a denying shadow", []Check{rule("c", Concurrency, true), rule("a", FixedWindow, false)},
			[]Result{deny(time.Second), allow(4)}, true, "a", 10, 4, 0, ""},
		{"lease dropped on denial", []Check{rule("c", Concurrency, false), rule("a", FixedWindow, false)},
			[]Result{allow(1), deny(time.Second)}, false, "a", 10, 0, time.Second, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Combine(tt.checks, tt.results, "L")
			if d.Allowed != tt.allowed || d.Rule.Name != tt.rule || d.Limit != tt.limit ||
				d.Remaining != tt.remaining || d.RetryAfter != tt.retry || d.Lease != tt.lease {
				t.Fatalf("Combine = allowed %v rule %q limit %d remaining %d retry %v lease %q; want %v %q %d %d %v %q",
					d.Allowed, d.Rule.Name, d.Limit, d.Remaining, d.RetryAfter, d.Lease,
					tt.allowed, tt.rule, tt.limit, tt.remaining, tt.retry, tt.lease)
			}
			if len(d.Results) != len(tt.results) {
				t.Fatalf("Results has %d entries, want %d", len(d.Results), len(tt.results))
			}
		})
	}
}
