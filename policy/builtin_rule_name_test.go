package policy

import (
	"errors"
	"strings"
	"testing"
)

// A rule of the file named like a built-in rule (default_initialize,
// default_requests, default_notifications) would count on the built-in's
// counter (keyspace.Counter keys on name, per and algorithm only) for the
// methods it does not name, with other settings: Parse refuses the name in
// every list, naming the field and its line.
func TestBuiltinRuleNameRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, yaml, want string }{
		{"tier", "tiers: {free: {limits: [{name: default_requests, methods: [tools/list], algorithm: token_bucket, limit: 1, period: 1h}]}}\n",
			`m.yaml:3: tiers.free.limits[0].name: "default_requests" is the name of a built-in rule`},
		{"global", "global: [{name: default_initialize, algorithm: gcra, limit: 5, period: 1m}]\n",
			`m.yaml:3: global[0].name: "default_initialize" is the name of a built-in rule`},
		{"tool", "tools: {x: {limits: [{name: default_notifications, per: tenant, algorithm: fixed_window, limit: 5, period: 1m}]}}\n",
			`m.yaml:3: tools.x.limits[0].name: "default_notifications" is the name of a built-in rule`},
	} {
		_, err := Parse("m.yaml", []byte(head+c.yaml))
		var es Errors
		if !errors.As(err, &es) || len(es) != 1 || !strings.HasPrefix(es[0].Error(), c.want) {
			t.Errorf("%s: got %v, want one problem starting %q", c.name, err, c.want)
		}
	}
	// Other names starting with default_ stay free.
	if _, err := Parse("m.yaml", []byte(head+"tiers: {free: {limits: [{name: default_calls, algorithm: gcra, limit: 5, period: 1m}]}}\n")); err != nil {
		t.Error(err)
	}
}
