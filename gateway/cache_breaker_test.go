package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// A cached tool's answer is settled on before the caller has it: the
// failure that opens the loop breaker has opened it by the time the client
// reads the answer, so the client's very next call is refused. Here the
// answer is a miss streamed to its caller as SSE (the upstream answers with
// an event stream): its final event used to be relayed before the breaker
// heard of it.
func TestCachedAnswerOpensTheBreakerBeforeItIsRelayed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, Config: `
breaker: {consecutive_failures: 1, cooldown: 1h}
tools:
  fail: {cache: {ttl: 1m, negative_ttl: 1m}}
`})
	tok := token(t, "acme", "alice")
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		r := post(t, e.mcpURL(0), tok, callBody(i, "fail", map[string]any{"message": "x"}), nil)
		if r.Status != want {
			t.Fatalf("call %d: %d %s, want %d", i, r.Status, r.Body, want)
		}
		if want == http.StatusTooManyRequests && r.denial(t).Scope != "breaker" {
			t.Fatalf("call %d: %s, want the breaker's denial", i, r.Body)
		}
	}
	if got := e.up.Calls("fail"); got != 1 {
		t.Fatalf("the upstream saw %d calls, want 1", got)
	}
}

// A cached call whose caller leaves while its own load runs on for the
// flight keeps its concurrency slot until that load ends: cancelling and
// calling again cannot run more loads at once than a concurrency rule
// allows.
func TestAbandonedCachedLoadKeepsItsSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: `
tools:
  slow:
    cache: {ttl: 1m}
    limits:
      - {name: one_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
`})
	tok := token(t, "acme", "alice")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = postCtx(ctx, e.mcpURL(0), tok, callBody(1, "slow", map[string]any{"ms": 5000}), nil)
	}()
	eventually(t, 10*time.Second, "the first load to reach the upstream", func() bool { return e.up.Calls("slow") == 1 })
	cancel() // the caller leaves; its load goes on for the flight
	<-done

	r := post(t, e.mcpURL(0), tok, callBody(2, "slow", map[string]any{"ms": 5001}), nil)
	if r.Status != http.StatusTooManyRequests || r.denial(t).Rule != "one_at_a_time" {
		t.Fatalf("a second load while the first runs: %d %s, want the concurrency rule's 429", r.Status, r.Body)
	}
	if got := e.up.Calls("slow"); got != 1 {
		t.Fatalf("the upstream saw %d loads at once, want 1", got)
	}
	eventually(t, 20*time.Second, "a call admitted once the first load ended", func() bool {
		return post(t, e.mcpURL(0), tok, callBody(3, "slow", map[string]any{"ms": 10}), nil).Status == http.StatusOK
	})
}
