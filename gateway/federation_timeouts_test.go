package gateway

import (
	"math"
	"testing"
	"time"
)

// The federation's session timeout is twice sessions.idle_timeout: for a
// Config built in code with a huge idle timeout, doubling must saturate,
// not overflow into a negative timeout that ends every session at once.
func TestFederationSessionTimeoutSaturates(t *testing.T) {
	t.Parallel()
	for _, idle := range []time.Duration{2000000 * time.Hour, math.MaxInt64} {
		if got := federationSessionTimeout(idle); got < idle {
			t.Errorf("federationSessionTimeout(%v) = %v, below the idle timeout", idle, got)
		}
	}
	if got := federationSessionTimeout(30 * time.Minute); got != minFederationSessionTimeout {
		t.Errorf("federationSessionTimeout(30m) = %v, want %v", got, minFederationSessionTimeout)
	}
	if got := addSat(math.MaxInt64-time.Second, 5*time.Second); got != math.MaxInt64 {
		t.Errorf("addSat near the top = %v, want the largest duration", got)
	}
}
