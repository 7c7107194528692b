package limit

import (
	"errors"
	"fmt"
	"time"
)

// Bounds of a BreakerSpec (see ValidateBreaker). Durations are whole
// milliseconds (the Redis store sets TTLs in milliseconds, so both stores
// then expire state at the same microsecond) of at most MaxPeriod; counts
// stay below MaxUsage so that every store counts them exactly.
const (
	MinBreakerDuration = time.Millisecond
	MaxBreakerDuration = MaxPeriod
	MaxBreakerCount    = MaxUsage
)

// ErrInvalidBreaker means a BreakerSpec failed ValidateBreaker, or a Request
// or an AddDenials count failed their checks. Nothing was read or written.
var ErrInvalidBreaker = errors.New("limit: invalid breaker")

// ValidateBreaker checks a breaker before a store evaluates it:
//
//   - Key is set;
//   - ConsecutiveDenials, ConsecutiveFailures and IdenticalCount are between
//     0 and MaxBreakerCount, and at least one trigger is on
//     (ConsecutiveDenials > 0, ConsecutiveFailures > 0 or IdenticalKey set);
//   - Cooldown, MaxCooldown and ProbeLease are whole milliseconds between
//     MinBreakerDuration and MaxBreakerDuration, and MaxCooldown >= Cooldown;
//   - with an IdenticalKey (distinct from Key), IdenticalCount is at least 2
//     (a count of 1 would stop every call) and IdenticalWithin is a duration
//     as above; without one, both are ignored but must not be negative.
//
// Errors wrap ErrInvalidBreaker.
func ValidateBreaker(b BreakerSpec) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidBreaker, b.Key, fmt.Sprintf(format, args...))
	}
	if b.Key == "" {
		return bad("empty key")
	}
	for _, n := range [...]struct {
		name string
		v    int64
	}{{"consecutive denials", b.ConsecutiveDenials}, {"consecutive failures", b.ConsecutiveFailures}, {"identical count", b.IdenticalCount}} {
		if n.v < 0 || n.v > MaxBreakerCount {
			return bad("%s must be between 0 and %d, got %d", n.name, int64(MaxBreakerCount), n.v)
		}
	}
	if b.ConsecutiveDenials == 0 && b.ConsecutiveFailures == 0 && b.IdenticalKey == "" {
		return bad("no trigger: set consecutive denials, consecutive failures or an identical-calls key")
	}
	durs := []struct {
		name string
		v    time.Duration
	}{{"cooldown", b.Cooldown}, {"max cooldown", b.MaxCooldown}, {"probe lease", b.ProbeLease}}
	if b.IdenticalKey != "" {
		durs = append(durs, struct {
			name string
			v    time.Duration
		}{"identical window", b.IdenticalWithin})
	} else if b.IdenticalWithin < 0 {
		return bad("identical window must not be negative, got %v", b.IdenticalWithin)
	}
	for _, d := range durs {
		if d.v < MinBreakerDuration || d.v > MaxBreakerDuration || d.v%time.Millisecond != 0 {
			return bad("%s must be whole milliseconds between %v and %v, got %v", d.name, MinBreakerDuration, MaxBreakerDuration, d.v)
		}
	}
	if b.MaxCooldown < b.Cooldown {
		return bad("max cooldown %v is below cooldown %v", b.MaxCooldown, b.Cooldown)
	}
	if b.IdenticalKey != "" {
		switch {
		case b.IdenticalCount < 2:
			return bad("identical calls need a count of at least 2, got %d", b.IdenticalCount)
		case b.IdenticalKey == b.Key:
			return fmt.Errorf("%w %q: %w: the identical-calls key is the breaker key", ErrInvalidBreaker, b.Key, ErrDuplicateKey)
		}
	}
	return nil
}

// ValidateDenials checks the count given to GuardedStore.AddDenials: 1 to
// MaxBreakerCount. Errors wrap ErrInvalidBreaker.
func ValidateDenials(n int64) error {
	if n < 1 || n > MaxBreakerCount {
		return fmt.Errorf("%w: denials to add must be between 1 and %d, got %d", ErrInvalidBreaker, int64(MaxBreakerCount), n)
	}
	return nil
}

// ValidateRequest checks a Request before a store evaluates it. Without a
// Breaker it is Validate (no Meter) or ValidateMetered (a Meter): the
// request is exactly a Take or a TakeMetered. With one, the checks may be
// empty even without a meter (a tool guarded by the breaker alone), the
// cost must still be at least 1 (ErrInvalidCost), the breaker must pass
// ValidateBreaker, and its Key and IdenticalKey must differ from every
// check's and the meter's key (ErrDuplicateKey, wrapped in
// ErrInvalidBreaker). Global checks, when there are, pass Validate on
// their own (the tenant checks may then be empty), and their keys differ
// from every other key of the request (ErrDuplicateKey, wrapped in
// ErrInvalidRule, or ErrInvalidBreaker for the breaker's keys).
func ValidateRequest(req Request) error {
	switch {
	case req.Breaker == nil && req.Meter == nil && len(req.Global) == 0:
		return Validate(req.Checks, req.Cost)
	case req.Meter != nil:
		if err := ValidateMetered(req.Checks, *req.Meter, req.Cost); err != nil {
			return err
		}
	case len(req.Checks) > 0:
		if err := Validate(req.Checks, req.Cost); err != nil {
			return err
		}
	case req.Cost < 1:
		return ErrInvalidCost
	}
	if len(req.Global) > 0 {
		if err := validateGlobal(req); err != nil {
			return err
		}
	}
	if req.Breaker == nil {
		return nil
	}
	b := req.Breaker
	if err := ValidateBreaker(*b); err != nil {
		return err
	}
	clash := func(key, what string) error {
		if key == b.Key || b.IdenticalKey != "" && key == b.IdenticalKey {
			return fmt.Errorf("%w %q: %w: %s uses it", ErrInvalidBreaker, b.Key, ErrDuplicateKey, what)
		}
		return nil
	}
	for _, cs := range [2][]Check{req.Checks, req.Global} {
		for _, c := range cs {
			if err := clash(c.Key, fmt.Sprintf("check %q", c.Rule.Name)); err != nil {
				return err
			}
		}
	}
	if req.Meter != nil {
		return clash(req.Meter.Key, "the meter")
	}
	return nil
}

// validateGlobal checks a request's global checks as Validate does, and
// that none of their keys is a tenant check's or the meter's.
func validateGlobal(req Request) error {
	if err := Validate(req.Global, req.Cost); err != nil {
		return err
	}
	for _, g := range req.Global {
		for _, c := range req.Checks {
			if c.Key == g.Key {
				return fmt.Errorf("%w %q: %w: %q is a tenant check's and a global check's", ErrInvalidRule, g.Rule.Name, ErrDuplicateKey, g.Key)
			}
		}
		if req.Meter != nil && req.Meter.Key == g.Key {
			return fmt.Errorf("%w %q: %w: the meter uses %q", ErrInvalidRule, g.Rule.Name, ErrDuplicateKey, g.Key)
		}
	}
	return nil
}
