package enforce_test

import (
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
)

// A tier rule of the file may be named like a built-in default rule
// ("default_requests"): Parse accepts it, and it replaces the built-in only
// for the methods it names (policy/methods.go). The other methods still
// count under the built-in rule of the same name, per and algorithm, so
// both count on one counter (keyspace.Counter) with different settings,
// which checkSharedCounters refuses for the file's own rules. Here the
// file limits tools/list to 1 an hour; prompts/list, which the docs say
// the built-in governs at 600 a minute, is then refused for the hour.
func TestFileRuleNamedLikeBuiltinSharesItsCounter(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			e := engines(t, store, 1, `
tiers:
  free:
    limits:
      - {name: default_requests, methods: [tools/list], algorithm: token_bucket, limit: 1, period: 1h, burst: 1}
`, "")[0]
			call := func(method string) enforce.Decision {
				tk, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "s", Method: method, Name: enforce.MethodTarget(method, "")})
				tk.Done(t.Context(), enforce.Outcome{})
				return d
			}
			if d := call("tools/list"); !d.Allowed {
				t.Fatalf("first tools/list denied: %+v", d.Limit)
			}
			for i := range 3 {
				if d := call("prompts/list"); !d.Allowed {
					t.Fatalf("prompts/list #%d (built-in default_requests, 600/min) denied by rule %q limit %d period %v: the file's tools/list rule spent the shared counter",
						i+1, d.Limit.Rule.Name, d.Limit.Rule.Limit, d.Limit.Rule.Period)
				}
			}
		})
	}
}
