package enforce_test

import (
	"errors"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/policy"
)

// A file's rule never shares a built-in rule's counter: Parse refuses a
// tier rule named like a built-in default rule ("default_requests"), and a
// rule named otherwise that names tools/list (the documented override)
// limits tools/list to its own 1 an hour while prompts/list stays with the
// built-in's 600 a minute. (Once, the same-named rule replaced the built-in
// only for the methods it named and both counted on one counter
// (keyspace.Counter) with different settings: prompts/list was refused for
// the hour.)
func TestFileRuleNeverSharesABuiltinCounter(t *testing.T) {
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
