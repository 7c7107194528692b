package policy

import "testing"

// breaker.max_cooldown must not be shorter than cooldown (docs/config.md:
// "duration ≥ cooldown"); the check runs only when cooldown is written in
// the file, so a max_cooldown below the default cooldown (30s) is accepted
// and then silently raised to 30s by the engine (max(MaxCooldown, Cooldown)).
func TestMaxCooldownBelowDefaultCooldownAccepted(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head+"breaker: {consecutive_denials: 3, max_cooldown: 10s}\n"))
	if err == nil {
		t.Fatalf("accepted: max_cooldown %v below cooldown %v", c.Breaker.MaxCooldown, c.Breaker.Cooldown)
	}
}
