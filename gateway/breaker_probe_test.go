package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// A half-open probe whose client goes away before its result frees the
// breaker at once (ReleaseProbe), instead of holding it for the probe's
// lease (the upstream timeout plus 5 s); callers refused while the probe is
// in flight are told to retry in 1 s, not at the end of that lease.
func TestBreakerProbeClientGone(t *testing.T) {
	t.Parallel()
	e := newBreakerEnv(t, nil, `
breaker:
  consecutive_failures: 1
  cooldown: 1s
  max_cooldown: 4s
`, upstream.Options{})
	a := newAgent(t, e, "acme", "gone", false)
	mustPass(t, a.call(0, "fail", failArgs), "failure")
	if ra := mustDeny(t, a.call(0, "echo", echoArgs), "breaker", "opened"); ra != 1 {
		t.Fatalf("Retry-After %d while open, want the cooldown (1)", ra)
	}
	time.Sleep(time.Second + 50*time.Millisecond)

	// The probe: a slow call whose client disconnects.
	slowBefore := e.up.Calls("slow")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		r, err := a.callCtx(ctx, 0, "slow", map[string]any{"ms": 4000})
		if err == nil {
			t.Errorf("the cancelled probe got an answer: %d %s", r.Status, r.Body)
		}
		done <- err
	}()
	eventually(t, 5*time.Second, "the probe to reach the upstream", func() bool {
		return e.up.Calls("slow") > slowBefore
	})

	// Refused while the probe is in flight, on both instances (the second
	// refusal on each is answered in process): retry in 1 s.
	for i := range 4 {
		r := a.call(i, "echo", echoArgs)
		if ra := mustDeny(t, r, "breaker", "during the probe"); ra != 1 {
			t.Fatalf("refusal %d during the probe: Retry-After %d, want 1 (the probe's lease is %v)", i, ra, e.cfg.Upstream.Timeout+5*time.Second)
		}
	}

	cancel()
	gone := time.Now()
	<-done
	// The lease is released once the gateway sees the client gone; a caller
	// may still be refused (and told 1 s) by an instance's in-process hold
	// for at most 1 s. The next admitted call is the new probe: its success
	// closes the breaker.
	eventually(t, 3*time.Second, "a call admitted after the probe's client went away", func() bool {
		r := a.call(0, "echo", echoArgs)
		if r.Status == http.StatusTooManyRequests {
			if ra := mustDeny(t, r, "breaker", "after the probe's client went away"); ra != 1 {
				t.Fatalf("Retry-After %d after the probe's client went away, want 1", ra)
			}
			return false
		}
		mustPass(t, r, "the next probe")
		return true
	})
	if d := time.Since(gone); d > enforce.ProbeRetry+500*time.Millisecond {
		t.Fatalf("the breaker refused calls for %v after the probe's client went away, want at most ~%v", d, enforce.ProbeRetry)
	}
	// That probe's success closed the breaker for the other instance too.
	eventually(t, 2*time.Second, "the other instance to admit", func() bool {
		return a.call(1, "echo", echoArgs).Status == http.StatusOK
	})
}
