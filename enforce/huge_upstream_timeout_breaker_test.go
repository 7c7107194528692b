package enforce_test

import (
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// upstream.timeout is accepted up to the largest Go duration, but the
// breaker's probe lease is computed as 2*upstream.timeout+5s, which
// overflows to a negative duration for timeouts above ~1281023h. The store
// then refuses every breaker spec (ErrInvalidBreaker), so every call is
// refused Unavailable (503), even under on_error: open, although Parse
// accepted the config and `mcpgate check` passes it.
func TestHugeUpstreamTimeoutBreaksBreaker(t *testing.T) {
	cfg, err := policy.Parse("t.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp", timeout: 2000000h}
auth: {jwt: {hs256_secret_env: X}}
store: {timeout: 10s, on_error: open}
tiers:
  free:
    limits:
      - {name: rpm, algorithm: fixed_window, limit: 1, period: 1m}
breaker: {consecutive_failures: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range 2 {
		ticket, d := e.Admit(t.Context(), enforce.Call{Tenant: "t", Subject: "s", Name: "x"})
		if d.Unavailable || d.Degraded != "" {
			t.Fatalf("call %d: accepted config (upstream.timeout 2000000h) degrades every call: %+v", i, d)
		}
		if i == 1 && d.Allowed {
			t.Fatalf("second call admitted past limit 1")
		}
		ticket.Done(t.Context(), enforce.Outcome{})
	}
}
