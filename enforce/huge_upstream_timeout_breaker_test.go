package enforce_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// Parse refuses an upstream.timeout so large that the breaker's probe
// lease (2*upstream.timeout+5s) would overflow; a Config built in code with
// one still works (the engine clamps before doubling): calls are decided,
// not degraded, and the limit holds. (Once, such a timeout was accepted and
// the negative lease made the store refuse every breaker spec, so every
// call was refused Unavailable, even under on_error: open.)
func TestHugeUpstreamTimeoutRefusedOrClamped(t *testing.T) {
	const file = `
upstream: {url: "http://127.0.0.1:1/mcp", timeout: %s}
auth: {jwt: {hs256_secret_env: X}}
store: {timeout: 10s, on_error: open}
tiers:
  free:
    limits:
      - {name: rpm, algorithm: fixed_window, limit: 1, period: 1m}
breaker: {consecutive_failures: 3}
`
	if _, err := policy.Parse("t.yaml", []byte(fmt.Sprintf(file, "2000000h"))); !errors.Is(err, policy.ErrInvalidConfig) {
		t.Fatalf("upstream.timeout 2000000h: Parse returned %v, want it refused", err)
	}
	cfg, err := policy.Parse("t.yaml", []byte(fmt.Sprintf(file, "60s")))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Upstream.Timeout = 2000000 * time.Hour // as a library user may set it
	e, err := enforce.New(enforce.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range 2 {
		ticket, d := e.Admit(t.Context(), enforce.Call{Tenant: "t", Subject: "s", Name: "x"})
		if d.Unavailable || d.Degraded != "" {
			t.Fatalf("call %d: upstream.timeout 2000000h degrades every call: %+v", i, d)
		}
		if i == 1 && d.Allowed {
			t.Fatalf("second call admitted past limit 1")
		}
		ticket.Done(t.Context(), enforce.Outcome{})
	}
}
