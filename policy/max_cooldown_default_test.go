package policy

import (
	"errors"
	"testing"
)

// max_cooldown is compared with the cooldown in force: the default one when
// cooldown is left out (or null), the written one otherwise; a bad
// cooldown is reported alone, not also as a comparison with the default.
func TestMaxCooldownComparedWithCooldownInForce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, yaml, want string }{
		// Accepted before, then silently raised to 30s by the engine
		// (max(MaxCooldown, Cooldown)).
		{"default cooldown", "breaker: {consecutive_denials: 3, max_cooldown: 10s}\n",
			"m.yaml:3: breaker.max_cooldown: must not be shorter than cooldown (30s, the default)"},
		{"null cooldown", "breaker: {consecutive_denials: 3, cooldown: null, max_cooldown: 10s}\n",
			"m.yaml:3: breaker.max_cooldown: must not be shorter than cooldown (30s, the default)"},
		{"written cooldown", "breaker: {consecutive_denials: 3, cooldown: 1m, max_cooldown: 59s}\n",
			"m.yaml:3: breaker.max_cooldown: must not be shorter than cooldown (1m0s)"},
		{"bad cooldown", "breaker: {consecutive_denials: 3, cooldown: 0s, max_cooldown: 10s}\n",
			"m.yaml:3: breaker.cooldown: must be positive"},
	} {
		_, err := Parse("m.yaml", []byte(head+c.yaml))
		var es Errors
		if !errors.As(err, &es) || len(es) != 1 || es[0].Error() != c.want {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
	for _, y := range []string{
		"breaker: {consecutive_denials: 3, max_cooldown: 30s}\n",
		"breaker: {consecutive_denials: 3, cooldown: 5s, max_cooldown: 10s}\n",
	} {
		if _, err := Parse("m.yaml", []byte(head+y)); err != nil {
			t.Errorf("%q: %v", y, err)
		}
	}
}
