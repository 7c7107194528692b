package limit

import (
	"errors"
	"testing"
	"time"
)

func TestValidateBreaker(t *testing.T) {
	good := BreakerSpec{
		Key: "b", ConsecutiveDenials: 5, ConsecutiveFailures: 5,
		IdenticalKey: "b:call:x", IdenticalCount: 20, IdenticalWithin: time.Minute,
		Cooldown: 30 * time.Second, MaxCooldown: 10 * time.Minute, ProbeLease: 10 * time.Second,
	}
	for _, tc := range []struct {
		name string
		edit func(*BreakerSpec)
		ok   bool
	}{
		{"good", func(*BreakerSpec) {}, true},
		{"denials only", func(b *BreakerSpec) { b.ConsecutiveFailures, b.IdenticalKey = 0, "" }, true},
		{"failures only", func(b *BreakerSpec) { b.ConsecutiveDenials, b.IdenticalKey = 0, "" }, true},
		{"identical only", func(b *BreakerSpec) { b.ConsecutiveDenials, b.ConsecutiveFailures = 0, 0 }, true},
		{"identical settings without a key are ignored", func(b *BreakerSpec) { b.IdenticalKey, b.IdenticalCount, b.IdenticalWithin = "", 1, 0 }, true},
		{"max cooldown = cooldown", func(b *BreakerSpec) { b.MaxCooldown = b.Cooldown }, true},
		{"bounds", func(b *BreakerSpec) {
			b.Cooldown, b.MaxCooldown, b.ProbeLease, b.IdenticalWithin = MinBreakerDuration, MaxBreakerDuration, MinBreakerDuration, MaxBreakerDuration
			b.ConsecutiveDenials, b.IdenticalCount = MaxBreakerCount, MaxBreakerCount
		}, true},
		{"empty key", func(b *BreakerSpec) { b.Key = "" }, false},
		{"no trigger", func(b *BreakerSpec) { b.ConsecutiveDenials, b.ConsecutiveFailures, b.IdenticalKey = 0, 0, "" }, false},
		{"negative denials", func(b *BreakerSpec) { b.ConsecutiveDenials = -1 }, false},
		{"negative failures", func(b *BreakerSpec) { b.ConsecutiveFailures = -1 }, false},
		{"negative identical count without a key", func(b *BreakerSpec) { b.IdenticalKey, b.IdenticalCount = "", -1 }, false},
		{"negative identical window without a key", func(b *BreakerSpec) { b.IdenticalKey, b.IdenticalWithin = "", -1 }, false},
		{"count above the bound", func(b *BreakerSpec) { b.ConsecutiveFailures = MaxBreakerCount + 1 }, false},
		{"identical count 1", func(b *BreakerSpec) { b.IdenticalCount = 1 }, false},
		{"identical count 0", func(b *BreakerSpec) { b.IdenticalCount = 0 }, false},
		{"no identical window", func(b *BreakerSpec) { b.IdenticalWithin = 0 }, false},
		{"identical key is the key", func(b *BreakerSpec) { b.IdenticalKey = b.Key }, false},
		{"no cooldown", func(b *BreakerSpec) { b.Cooldown = 0 }, false},
		{"negative cooldown", func(b *BreakerSpec) { b.Cooldown = -time.Second }, false},
		{"cooldown not in ms", func(b *BreakerSpec) { b.Cooldown = time.Second + time.Microsecond }, false},
		{"max cooldown below cooldown", func(b *BreakerSpec) { b.MaxCooldown = time.Second }, false},
		{"max cooldown above the bound", func(b *BreakerSpec) { b.MaxCooldown = MaxBreakerDuration + time.Millisecond }, false},
		{"no probe lease", func(b *BreakerSpec) { b.ProbeLease = 0 }, false},
		{"identical window above the bound", func(b *BreakerSpec) { b.IdenticalWithin = MaxBreakerDuration + time.Millisecond }, false},
	} {
		b := good
		tc.edit(&b)
		err := ValidateBreaker(b)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrInvalidBreaker) {
			t.Errorf("%s: %v, want ok %v (errors wrapping ErrInvalidBreaker)", tc.name, err, tc.ok)
		}
	}
}

func TestValidateRequest(t *testing.T) {
	r := Rule{Name: "r", Algorithm: FixedWindow, Limit: 1, Period: time.Second}
	checks := []Check{{Rule: r, Key: "c"}}
	m := &Meter{Key: "m", ExpireAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := &BreakerSpec{Key: "b", ConsecutiveDenials: 1, Cooldown: time.Second, MaxCooldown: time.Second, ProbeLease: time.Second}
	clash := *b
	clash.Key = "c"
	meterClash := *b
	meterClash.IdenticalKey, meterClash.IdenticalCount, meterClash.IdenticalWithin = "m", 2, time.Second
	for _, tc := range []struct {
		name   string
		req    Request
		target error // nil: valid
	}{
		{"take", Request{Checks: checks, Cost: 1}, nil},
		{"take metered", Request{Checks: checks, Meter: m, Cost: 1}, nil},
		{"meter alone", Request{Meter: m, Cost: 1}, nil},
		{"breaker alone", Request{Breaker: b, Cost: 1}, nil},
		{"everything", Request{Checks: checks, Meter: m, Breaker: b, Cost: 1}, nil},
		{"nothing", Request{Cost: 1}, ErrNoChecks},
		{"breaker alone, cost 0", Request{Breaker: b}, ErrInvalidCost},
		{"checks, cost 0", Request{Checks: checks, Breaker: b}, ErrInvalidCost},
		{"bad breaker", Request{Checks: checks, Breaker: &BreakerSpec{Key: "b"}, Cost: 1}, ErrInvalidBreaker},
		{"breaker key is a check's", Request{Checks: checks, Breaker: &clash, Cost: 1}, ErrDuplicateKey},
		{"identical key is the meter's", Request{Meter: m, Breaker: &meterClash, Cost: 1}, ErrDuplicateKey},
		{"bad meter", Request{Meter: &Meter{Key: "m"}, Breaker: b, Cost: 1}, ErrInvalidMeter},
	} {
		err := ValidateRequest(tc.req)
		if tc.target == nil && err != nil || tc.target != nil && !errors.Is(err, tc.target) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.target)
		}
	}
	if err := ValidateDenials(0); !errors.Is(err, ErrInvalidBreaker) {
		t.Errorf("ValidateDenials(0): %v", err)
	}
	if err := ValidateDenials(MaxBreakerCount); err != nil {
		t.Errorf("ValidateDenials(MaxBreakerCount): %v", err)
	}
}
