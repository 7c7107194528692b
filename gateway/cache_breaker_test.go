package gateway

import (
	"net/http"
	"testing"

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
