package policy

import (
	"errors"
	"strings"
	"testing"
)

// yaml.v3 reads an integer with a leading zero as octal (limit: 010 is 8,
// as YAML 1.1 did), where YAML 1.2's core schema, and most readers, read
// decimal 10; 0x, 0o and 0b integers are taken too. A count then enforces
// something other than what the operator reads: Parse accepts decimal
// integers only, and names the field and its line.
func TestNonDecimalIntegersRefused(t *testing.T) {
	t.Parallel()
	rule := func(limit string) string {
		return "tiers: {free: {limits: [{name: a, algorithm: gcra, limit: " + limit + ", period: 1s}]}}\n"
	}
	for _, c := range []struct{ name, yaml, want string }{
		{"leading zero limit", rule("010"),
			"m.yaml:3: tiers.free.limits[0].limit: integer 010 has a leading zero"},
		{"leading zero, decimal digits only", rule("08"),
			"m.yaml:3: tiers.free.limits[0].limit: integer 08 has a leading zero"},
		{"signed leading zero", "tiers: {free: {monthly_quota: +010}}\n",
			"m.yaml:3: tiers.free.monthly_quota: integer +010 has a leading zero"},
		{"leading zero quota", "tiers:\n  free:\n    monthly_quota: 010\n",
			"m.yaml:5: tiers.free.monthly_quota: integer 010 has a leading zero"},
		{"leading zero cost", "tools: {x: {cost: 007}}\n",
			"m.yaml:3: tools.x.cost: integer 007 has a leading zero"},
		{"hexadecimal", rule("0x10"),
			"m.yaml:3: tiers.free.limits[0].limit: integer 0x10 is not decimal"},
		{"octal 0o", "sessions: {max_per_tenant: 0o7}\n",
			"m.yaml:3: sessions.max_per_tenant: integer 0o7 is not decimal"},
		{"binary", "breaker: {consecutive_failures: 0b11}\n",
			"m.yaml:3: breaker.consecutive_failures: integer 0b11 is not decimal"},
		{"warm argument", "cache: {warm: [{tool: x, tenant: t, args: {n: 010}}]}\ntools: {x: {cache: {ttl: 1m}}}\n",
			"m.yaml:3: cache.warm[0].args.n: integer 010 has a leading zero"},
		{"warm argument, decimal digits only", "cache: {warm: [{tool: x, tenant: t, args: {n: 08}}]}\ntools: {x: {cache: {ttl: 1m}}}\n",
			"m.yaml:3: cache.warm[0].args.n: integer 08 has a leading zero"},
	} {
		_, err := Parse("m.yaml", []byte(head+c.yaml))
		var es Errors
		if !errors.As(err, &es) || len(es) != 1 || !strings.HasPrefix(es[0].Error(), c.want) {
			t.Errorf("%s: got %v, want one problem starting %q", c.name, err, c.want)
		}
	}
	// Decimal integers, 0 and signed ones, are read as written.
	cfg, err := Parse("m.yaml", []byte(head+rule("10")+"tools: {x: {cost: 3}}\nsessions: {max_per_tenant: +7}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Tiers["free"].Limits[0].Limit; got != 10 {
		t.Errorf("limit: 10 read as %d", got)
	}
	if cfg.Tools["x"].Cost.Fixed != 3 || cfg.Sessions.MaxPerTenant != 7 {
		t.Errorf("cost: 3 read as %d, max_per_tenant: +7 as %d", cfg.Tools["x"].Cost.Fixed, cfg.Sessions.MaxPerTenant)
	}
}
