package enforce_test

import (
	"errors"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// A tier rule of the file named like a built-in default rule
// ("default_requests") replaced the built-in only for the methods it
// named (policy/methods.go); the other methods still counted under the
// built-in rule of the same name, per and algorithm, so both counted on
// one counter (keyspace.Counter) with different settings: with the file
// limiting tools/list to 1 an hour, prompts/list, which the docs say the
// built-in governs at 600 a minute, was refused for the hour. Parse now
// refuses the name; a rule named otherwise that names tools/list (the
// documented override) leaves prompts/list to the built-in.
func TestFileRuleNamedLikeBuiltinSharesItsCounter(t *testing.T) {
	const clash = "upstream: {url: \"http://127.0.0.1:1/mcp\"}\nauth: {jwt: {hs256_secret_env: X}}\n" +
		"tiers: {free: {limits: [{name: default_requests, methods: [tools/list], algorithm: token_bucket, limit: 1, period: 1h, burst: 1}]}}\n"
	if _, err := policy.Parse("t.yaml", []byte(clash)); !errors.Is(err, policy.ErrInvalidConfig) {
		t.Fatalf("a tier rule named default_requests: Parse returned %v, want it refused", err)
	}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			e := engines(t, store, 1, `
tiers:
  free:
    limits:
      - {name: lists, methods: [tools/list], algorithm: token_bucket, limit: 1, period: 1h, burst: 1}
`, "")[0]
			call := func(method string) enforce.Decision {
				tk, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "s", Method: method, Name: enforce.MethodTarget(method, "")})
				tk.Done(t.Context(), enforce.Outcome{})
				return d
			}
			if d := call("tools/list"); !d.Allowed {
				t.Fatalf("first tools/list denied: %+v", d.Limit)
			}
			if d := call("tools/list"); d.Allowed {
				t.Fatalf("second tools/list admitted past the file's limit of 1 an hour")
			}
			for i := range 3 {
				if d := call("prompts/list"); !d.Allowed {
					t.Fatalf("prompts/list #%d (built-in default_requests, 600/min) denied by rule %q limit %d period %v",
						i+1, d.Limit.Rule.Name, d.Limit.Rule.Limit, d.Limit.Rule.Period)
				}
			}
		})
	}
}
