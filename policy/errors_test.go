package policy

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/limit"
)

// Each case is appended to head, so its first line is line 3. want is the
// whole error text: every problem, in line order.
var badConfigs = []struct {
	name, yaml string
	want       []string
}{
	{"unknown top-level key", "tiersx: {}\n",
		[]string{`m.yaml:3: tiersx: unknown field (did you mean "tiers"?)`}},
	{"unknown key, no suggestion", "store: {zzzzzz: 1}\n",
		[]string{`m.yaml:3: store.zzzzzz: unknown field (want one of on_error, redis, timeout)`}},
	{"typo by transposition", "store:\n  timeout: 1s\n  redsi: \"\"\n",
		[]string{`m.yaml:5: store.redsi: unknown field (did you mean "redis"?)`}},
	{"duplicate key", "listen: :1\nlisten: :2\n",
		[]string{`m.yaml:4: listen: duplicate key (first at line 3)`}},
	{"section of the wrong type", "store: [1]\n",
		[]string{`m.yaml:3: store: want a mapping, got a list`}},
	{"quoted integer", "tiers: {free: {limits: [{name: a, algorithm: gcra, limit: \"10\", period: 1s}]}}\n",
		[]string{`m.yaml:3: tiers.free.limits[0].limit: want an integer, got the string "10"`}},
	{"string for a number", "tiers:\n  free:\n    monthly_quota: lots\n",
		[]string{`m.yaml:5: tiers.free.monthly_quota: want an integer, got the string "lots"`}},
	{"float for an integer", "tiers: {free: {monthly_quota: 1.5}}\n",
		[]string{`m.yaml:3: tiers.free.monthly_quota: want an integer, got the number 1.5`}},
	{"integer out of range", "tiers: {free: {monthly_quota: 99999999999999999999}}\n",
		[]string{`m.yaml:3: tiers.free.monthly_quota: integer 99999999999999999999 is out of range`}},
	{"negative number", "tiers: {free: {monthly_quota: -1}}\n",
		[]string{`m.yaml:3: tiers.free.monthly_quota: must not be negative, got -1`}},
	{"bad duration", "store: {timeout: 5 minutes}\n",
		[]string{`m.yaml:3: store.timeout: bad duration "5 minutes" (want Go syntax: 25ms, 1s, 1m, 720h)`}},
	{"duration without unit", "store: {timeout: 25}\n",
		[]string{`m.yaml:3: store.timeout: bad duration 25: a unit is required (e.g. "25s")`}},
	{"duration in days", "breaker: {cooldown: 1d}\n",
		[]string{`m.yaml:3: breaker.cooldown: bad duration "1d" (Go durations have no "d" unit: write 24h for a day)`}},
	{"zero timeout", "store: {timeout: 0s}\n",
		[]string{`m.yaml:3: store.timeout: must be positive`}},
	{"zero cache timeout", "cache: {timeout: 0s}\n",
		[]string{`m.yaml:3: cache.timeout: must be positive`}},
	{"cache sizes", "cache: {max_entries: 0, max_bytes: 1000}\n",
		[]string{`m.yaml:3: cache.max_entries: must be at least 1, got 0`,
			`m.yaml:3: cache.max_bytes: must be at least 1048576 (1 MiB: the in-process cache splits it over its shards), got 1000`}},
	{"negative duration", "upstream2: 1\nbreaker: {cooldown: -1s}\n",
		[]string{`m.yaml:3: upstream2: unknown field (did you mean "upstream"?)`, `m.yaml:4: breaker.cooldown: must not be negative, got -1s`}},
	{"percentage without %", "tools: {s: {cache: {ttl: 1m, jitter: 10}}}\n",
		[]string{`m.yaml:3: tools.s.cache.jitter: bad percentage: want a string like "10%", got the integer 10`}},
	{"percentage above 100", "tools: {s: {cache: {ttl: 1m, jitter: \"150%\"}}}\n",
		[]string{`m.yaml:3: tools.s.cache.jitter: bad percentage "150%": must be between 0% and 100%`}},
	{"boolean of the wrong type", "tools: {t: {cache: {ttl: 1s, shared: \"yes\"}}}\n",
		[]string{`m.yaml:3: tools.t.cache.shared: want true or false, got the string "yes"`}},
	{"duplicate section", "upstream: {url: http://u/mcp}\n",
		[]string{`m.yaml:3: upstream: duplicate key (first at line 1)`}},
	{"unknown algorithm", "tiers:\n  free:\n    limits:\n      - {name: a, algorithm: fixed_window, limit: 1, period: 1s}\n      - {name: b, algorithm: lru, limit: 1, period: 1s}\n",
		[]string{`m.yaml:7: tiers.free.limits[1].algorithm: unknown algorithm "lru" (want one of fixed_window, sliding_window, sliding_window_counter, token_bucket, gcra, concurrency)`}},
	{"zero limit", "global: [{name: g, algorithm: gcra, limit: 0, period: 1s}]\n",
		[]string{`m.yaml:3: global[0].limit: must be at least 1, got 0`}},
	{"missing rule fields", "global:\n  - name: g\n",
		[]string{`m.yaml:4: global[0].algorithm: required`, `m.yaml:4: global[0].limit: required`, `m.yaml:4: global[0].period: required`}},
	{"period too short", "global: [{name: g, algorithm: gcra, limit: 1, period: 1us}]\n",
		[]string{`m.yaml:3: global[0].period: must be between 1ms and 9600h0m0s, got 1µs`}},
	{"period not whole microseconds", "global: [{name: g, algorithm: gcra, limit: 1, period: 1.0000001s}]\n",
		[]string{`m.yaml:3: global[0].period: must be a whole number of microseconds, got 1.0000001s`}},
	{"limit.Rule.Validate failure", "global: [{name: g, algorithm: gcra, limit: 9007199254740, period: 1s}]\n",
		[]string{`m.yaml:3: global[0]: limit or burst times period is too large to count exactly`}},
	{"burst on a window", "global: [{name: g, algorithm: fixed_window, limit: 1, period: 1s, burst: 5}]\n",
		[]string{`m.yaml:3: global[0].burst: only token_bucket and gcra have a burst (fixed_window would ignore it)`}},
	{"bad rule name", "global: [{name: \"a b\", algorithm: gcra, limit: 1, period: 1s}]\n",
		[]string{`m.yaml:3: global[0].name: bad rule name "a b": use 1 to 64 letters, digits, '_', '-' or '.' (it appears in headers)`}},
	{"per global in a tier", "tiers:\n  free:\n    limits:\n      - {name: a, per: global, algorithm: gcra, limit: 1, period: 1s}\n",
		[]string{`m.yaml:6: tiers.free.limits[0].per: per global is not allowed here: global rules go in the top-level "global" list`}},
	{"per global in a tool", "tools: {t: {limits: [{name: a, per: global, algorithm: gcra, limit: 1, period: 1s}]}}\n",
		[]string{`m.yaml:3: tools.t.limits[0].per: per global is not allowed here: global rules go in the top-level "global" list`}},
	{"tenant rule in the global list", "global: [{name: g, per: tenant, algorithm: gcra, limit: 1, period: 1s}]\n",
		[]string{`m.yaml:3: global[0].per: per tenant is not allowed in the global list (global rules count across all tenants); put tenant rules in a tier or a tool`}},
	{"unknown per", "tiers: {free: {limits: [{name: a, per: ip, algorithm: gcra, limit: 1, period: 1s}]}}\n",
		[]string{`m.yaml:3: tiers.free.limits[0].per: unknown per "ip" (want one of tenant, tenant_tool, subject, subject_tool)`}},
	{"duplicate rule name in a tier", "tiers:\n  free:\n    limits:\n      - {name: a, algorithm: gcra, limit: 1, period: 1s}\n      - {name: a, per: subject, algorithm: gcra, limit: 1, period: 1s}\n",
		[]string{`m.yaml:7: tiers.free.limits[1].name: duplicate rule name "a" (first at line 6)`}},
	{"tool rule shares a tier rule's counter",
		"tiers:\n  free:\n    limits: [{name: a, per: tenant_tool, algorithm: gcra, limit: 1, period: 1s}]\ntools:\n  t:\n    limits: [{name: a, per: tenant_tool, algorithm: gcra, limit: 9, period: 1s}]\n",
		[]string{`m.yaml:8: tools.t.limits[0].name: rule "a" per tenant_tool is also defined in tiers.free.limits[0] (line 5): the two would share one counter; rename one`}},
	{"tool rules share a counter with different settings",
		"tools:\n  t:\n    limits: [{name: a, per: tenant, algorithm: gcra, limit: 1, period: 1s}]\n  u:\n    limits: [{name: a, per: tenant, algorithm: gcra, limit: 2, period: 1s}]\n",
		[]string{`m.yaml:7: tools.u.limits[0].name: rule "a" per tenant shares a counter with tools.t.limits[0] (line 5) but has different settings; rules that share a counter must be identical`}},
	{"unknown default tier", "default_tier: gold\ntiers: {free: {}, pro: {}}\n",
		[]string{`m.yaml:3: default_tier: unknown tier "gold" (tiers: free, pro)`}},
	{"no tier to default to", "tiers: {pro: {}}\n",
		[]string{`m.yaml:3: default_tier: not set, and there is no tier named "free" to default to`}},
	{"bad redis entries", "store:\n  redis: [\"redis://x:1\", \"nohost\", \"h:99999\"]\n",
		[]string{
			`m.yaml:4: store.redis[0]: a list holds Cluster seed addresses (host:port), not URLs; for TLS or a password use one URL with addr= parameters`,
			`m.yaml:4: store.redis[1]: bad Redis address "nohost": want redis://host:6379/0, rediss://user:pass@host:6380, unix:///path or host:port`,
			`m.yaml:4: store.redis[2]: bad Redis address "h:99999": want redis://host:6379/0, rediss://user:pass@host:6380, unix:///path or host:port`,
		}},
	{"bad redis URL hides the password", "cache: {redis: \"http://user:hunter2@h:1\"}\n",
		[]string{`m.yaml:3: cache.redis: bad Redis URL "http://user:xxxxx@h:1": invalid URL scheme: http`}},
	{"redis of the wrong type", "store: {redis: {a: 1}}\n",
		[]string{`m.yaml:3: store.redis: want a string or a list of host:port addresses, got a mapping`}},
	{"on_error", "store: {on_error: maybe}\ntools: {t: {on_error: sometimes}}\n",
		[]string{
			`m.yaml:3: store.on_error: unknown failure policy "maybe" (want one of open, closed, local)`,
			`m.yaml:4: tools.t.on_error: unknown failure policy "sometimes" (want one of open, closed, local)`,
		}},
	{"breaker", "breaker:\n  key: ip\n  identical_calls: {count: 3}\n  alert_webhook: hooks.example\n",
		[]string{
			`m.yaml:4: breaker.key: unknown breaker key "ip" (want one of subject, tenant, session)`,
			`m.yaml:5: breaker.identical_calls.within: required when count is set`,
			`m.yaml:6: breaker.alert_webhook: bad URL "hooks.example": want http:// or https:// and a host`,
		}},
	// The stores refuse a breaker whose durations pass
	// limit.MaxBreakerDuration (9600h) on every call it guards: Parse
	// refuses them instead.
	{"breaker durations above the stores' bound", "breaker:\n  consecutive_failures: 3\n  identical_calls: {count: 5, within: 9600h1ms}\n  cooldown: 10000h\n  max_cooldown: 10000h\n",
		[]string{
			`m.yaml:5: breaker.identical_calls.within: must be at most 9600h0m0s (the longest a breaker keeps state), got 9600h0m0.001s`,
			`m.yaml:6: breaker.cooldown: must be at most 9600h0m0s (the longest a breaker keeps state), got 10000h0m0s`,
			`m.yaml:7: breaker.max_cooldown: must be at most 9600h0m0s (the longest a breaker keeps state), got 10000h0m0s`,
		}},
	// max_cooldown is compared with cooldown once both are read, in
	// whichever order the file gives them.
	{"max_cooldown below cooldown", "breaker: {consecutive_failures: 3, cooldown: 1m, max_cooldown: 10s}\n",
		[]string{`m.yaml:3: breaker.max_cooldown: must not be shorter than cooldown (1m0s)`}},
	{"max_cooldown below cooldown given before it", "breaker: {consecutive_failures: 3, max_cooldown: 10s, cooldown: 1m}\n",
		[]string{`m.yaml:3: breaker.max_cooldown: must not be shorter than cooldown (1m0s)`}},
	// The stores refuse a cost or a quota above limit.MaxUsage (2^50) on
	// every call it meters: Parse refuses them instead.
	{"usage amounts above the stores' bound", "tiers: {free: {monthly_quota: 1125899906842625}}\ntools:\n  t: {cost: 2000000000000000}\n  u: {cost: {estimate: 1125899906842625, from_result: _meta.cost}}\n",
		[]string{
			`m.yaml:3: tiers.free.monthly_quota: must be at most 1125899906842624 (the most a usage meter counts), got 1125899906842625`,
			`m.yaml:5: tools.t.cost: must be at most 1125899906842624 (the most a usage meter counts), got 2000000000000000`,
			`m.yaml:6: tools.u.cost.estimate: must be at most 1125899906842624 (the most a usage meter counts), got 1125899906842625`,
		}},
	{"usage amounts below their least", "tools:\n  t: {cost: 0}\n  u: {cost: {estimate: -1, from_result: _meta.cost}}\n",
		[]string{
			`m.yaml:4: tools.t.cost: must be at least 1, got 0`,
			`m.yaml:5: tools.u.cost.estimate: must be at least 1, got -1`,
		}},
	{"usage store", "usage: {store: \"postgres://x\"}\n",
		[]string{`m.yaml:3: usage.store: unknown usage store "postgres://x" (want sqlite:PATH or dynamodb:TABLE)`}},
	{"sqlite in memory", "usage: {store: \"sqlite::memory:\"}\n",
		[]string{`m.yaml:3: usage.store: sqlite: an in-memory database cannot hold usage (each pooled connection is a database of its own): use a file path`}},
	{"sqlite temporary", "usage: {store: \"sqlite:file:\"}\n",
		[]string{`m.yaml:3: usage.store: sqlite: an in-memory database cannot hold usage (each pooled connection is a database of its own): use a file path`}},
	{"sqlite connection options", "usage: {store: \"sqlite:u.db?mode=memory\"}\n",
		[]string{`m.yaml:3: usage.store: sqlite: the path must not contain '?' (connection options are not taken)`}},
	{"dynamodb table", "usage: {store: \"dynamodb:a\"}\n",
		[]string{`m.yaml:3: usage.store: bad DynamoDB table name "a" (3 to 255 letters, digits, '_', '-' or '.')`}},
	{"warm tool not in tools", "cache:\n  warm:\n    - {tool: search, tenant: acme}\n",
		[]string{`m.yaml:5: cache.warm[0].tool: unknown tool "search" (it must be listed under tools, with a cache)`}},
	{"warm tool without cache or tenant", "tools: {a: {}, b: {cache: {ttl: 1s}}}\ncache:\n  warm:\n    - {tool: a, tenant: x}\n    - {tool: b, args: {q: 1}}\n",
		[]string{
			`m.yaml:6: cache.warm[0].tool: tool "a" has no cache to warm`,
			`m.yaml:7: cache.warm[1].tenant: required: tool "b" caches per tenant (its cache is not shared)`,
		}},
	{"cost", "tools:\n  a: {cost: 0}\n  b: {cost: {estimate: 5}}\n  c: {cost: [1]}\n  d: {cost: {estimate: 1, from_result: \"a..b\"}}\n",
		[]string{
			`m.yaml:4: tools.a.cost: must be at least 1, got 0`,
			`m.yaml:5: tools.b.cost.from_result: required in the mapping form (write ` + "`cost: N`" + ` for a fixed cost)`,
			`m.yaml:6: tools.c.cost: want an integer or a mapping {estimate, from_result}, got a list`,
			`m.yaml:7: tools.d.cost.from_result: bad result path "a..b": want dot-separated field names such as _meta.usage.tokens`,
		}},
	{"cache without ttl, bad tags", "tools:\n  s:\n    cache: {tags: [\"p:{{id}}\", \"{{args.id\"]}\n    invalidates: [\"\"]\n",
		[]string{
			`m.yaml:5: tools.s.cache.ttl: required (how long a result stays cached)`,
			`m.yaml:5: tools.s.cache.tags[0]: bad tag "p:{{id}}": {{id}}: want {{args.NAME}} or {{args.NAME.FIELD}}`,
			`m.yaml:5: tools.s.cache.tags[1]: bad tag "{{args.id": "{{" without "}}"`,
			`m.yaml:6: tools.s.invalidates[0]: bad tag "": empty`,
		}},
	{"listen", "listen: 8080\n",
		[]string{`m.yaml:3: listen: bad listen address "8080": want host:port (e.g. 127.0.0.1:8080 or :8080)`}},
	{"syntax error", "tiers: [\n",
		[]string{`m.yaml:3: syntax error: did not find expected node content`}},
	{"tab indentation", "tiers:\n\tfree: {}\n",
		[]string{`m.yaml:4: syntax error: found character that cannot start any token`}},
	{"unknown anchor", "tiers: *nope\n",
		[]string{`m.yaml:3: syntax error: unknown anchor 'nope' referenced`}},
	{"second document", "---\nlisten: :1\n",
		[]string{`m.yaml:3: only one YAML document is allowed (a second starts here)`}},
	{"control character", "listen: \"\x01\"\n",
		[]string{`m.yaml:3: control character U+0001 is not allowed`}},
	{"invalid UTF-8", "\n\nlisten: \xff\n",
		[]string{`m.yaml:5: file is not valid UTF-8`}},
	{"warm entries", "tools: {t: {cache: {ttl: 1s}}}\ncache:\n  warm:\n    - t\n    - {args: {}}\n",
		[]string{
			`m.yaml:6: cache.warm[0]: want a mapping, got the string "t"`,
			`m.yaml:7: cache.warm[1].tool: required`,
		}},
	{"invalid UTF-8 after CR line ends", "\r\r\n\rlisten: \xff\n",
		[]string{`m.yaml:6: file is not valid UTF-8`}},
	{"warm args of the wrong type", "tools: {t: {cache: {ttl: 1s, shared: true}}}\ncache: {warm: [{tool: t, args: [1]}]}\n",
		[]string{`m.yaml:4: cache.warm[0].args: want a mapping of argument names to values, got a list`}},
	{"merge of a scalar", "tools: {t: {<<: 5}}\n",
		[]string{`m.yaml:3: tools.t: merge key (<<) wants a mapping or a list of mappings, got the integer 5`}},
	{"boolean for a string", "default_tier: true\n",
		[]string{`m.yaml:3: default_tier: want a string, got the boolean true (quote it if you mean the text)`}},
	{"mapping for a string", "listen: {a: 1}\n",
		[]string{`m.yaml:3: listen: want a string, got a mapping`}},
	{"scalar for a list", "tiers: {free: {limits: 5}}\n",
		[]string{`m.yaml:3: tiers.free.limits: want a list, got the integer 5`}},
	{"threshold too large", "breaker: {consecutive_denials: 3000000000}\n",
		[]string{`m.yaml:3: breaker.consecutive_denials: must be at most 2147483647, got 3000000000`}},
	{"explicit int tag on text", "tiers: {free: {monthly_quota: !!int abc}}\n",
		[]string{`m.yaml:3: tiers.free.monthly_quota: want an integer, got "abc"`}},
	{"unknown per in the global list", "global: [{name: g, per: ip, algorithm: gcra, limit: 1, period: 1s}]\n",
		[]string{`m.yaml:3: global[0].per: unknown per "ip" (rules in the global list are always per global)`}},
	{"merge of a list with a scalar", "tools: {t: {<<: [{cost: 2}, 3]}}\n",
		[]string{`m.yaml:3: tools.t: merge key (<<) wants a mapping or a list of mappings, got the integer 3`}},
	{"duplicate key inside a merged mapping, named where it is used", "a: &a {cost: 1, cost: 2}\ntools: {t: {<<: *a}}\n",
		[]string{`m.yaml:3: a: unknown field (want one of audit, auth, breaker, cache, default_tier, global, listen, server, sessions, store, tiers, tools, upstream, upstreams, usage)`,
			`m.yaml:3: tools.t.cost: duplicate key (first at line 3)`}},
	{"mapping key that is not a string", "tiers: {[a]: {}}\n",
		[]string{`m.yaml:3: tiers: keys must be strings, got a list`}},
}

func TestBadConfigs(t *testing.T) {
	for _, tc := range badConfigs {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("m.yaml", []byte(head+tc.yaml))
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			if c != nil {
				t.Error("config returned with an error")
			}
			if got, want := err.Error(), strings.Join(tc.want, "\n"); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// Problems in sections that replace head's own.
var badWhole = []struct {
	name, yaml string
	want       []string
}{
	{"empty file", "", []string{
		`m.yaml:1: upstream.url: required (the MCP server to forward to)`,
		`m.yaml:1: auth.jwt: set one key source: hs256_secret_env, jwks_url, jwks_file, public_key_file`,
	}},
	{"not a mapping", "[1, 2]\n", []string{
		`m.yaml:1: want a mapping, got a list`,
		`m.yaml:1: upstream.url: required (the MCP server to forward to)`,
		`m.yaml:1: auth.jwt: set one key source: hs256_secret_env, jwks_url, jwks_file, public_key_file`,
	}},
	{"upstream and auth", `
upstream:
  url: ftp://x/mcp
  headers: {"Bad Name": x, Authorization: a, authorization: b, X-Ref: "${1BAD}"}
  max_body_bytes: 0
  timeout: 0
auth:
  jwt:
    hs256_secret_env: ${SECRET}
    jwks_url: "https://idp/jwks"
    public_key_file: key.pem
  admin_token_env: "my token"
`, []string{
		`m.yaml:3: upstream.url: bad URL "ftp://x/mcp": want http:// or https:// and a host`,
		`m.yaml:4: upstream.headers["Bad Name"]: not a valid HTTP header name`,
		`m.yaml:4: upstream.headers.authorization: same header as "Authorization" at line 4 (header names ignore case)`,
		`m.yaml:4: upstream.headers.X-Ref: bad variable reference ${1BAD}: want ${NAME} (letters, digits and _)`,
		`m.yaml:5: upstream.max_body_bytes: must be at least 1, got 0`,
		`m.yaml:6: upstream.timeout: must be positive`,
		`m.yaml:9: auth.jwt.hs256_secret_env: want the name of an environment variable (e.g. MCPGATE_JWT_SECRET), not a $ reference`,
		`m.yaml:11: auth.jwt.public_key_file: only one key source may be set (jwks_url is set too)`,
		`m.yaml:12: auth.admin_token_env: "my token" is not an environment variable name (letters, digits and _)`,
	}},
	{"url from an unset variable", "upstream: {url: \"${MCPGATE_TEST_UNSET}\"}\nauth: {jwt: {jwks_file: j.json}}\n", []string{
		`m.yaml:1: upstream.url: required, but "${MCPGATE_TEST_UNSET}" expands to an empty string`,
	}},
	{"url broken by an unset variable", "upstream: {url: \"http://${MCPGATE_TEST_UNSET}/mcp\"}\nauth: {jwt: {jwks_file: j.json}}\n", []string{
		`m.yaml:1: upstream.url: bad URL "http://${MCPGATE_TEST_UNSET}/mcp" (not set: MCPGATE_TEST_UNSET): want http:// or https:// and a host`,
	}},
	{"url broken by a set variable", "upstream: {url: \"${MCPGATE_TEST_SET}/mcp?k=${MCPGATE_TEST_SET}\"}\nauth: {jwt: {jwks_file: j.json}}\n", []string{
		`m.yaml:1: upstream.url: bad URL "${MCPGATE_TEST_SET}/mcp?k=${MCPGATE_TEST_SET}": want http:// or https:// and a host`,
	}},
	{"store.redis from an unset variable", "upstream: {url: \"http://u/mcp\"}\nauth: {jwt: {jwks_file: j.json}}\nstore: {redis: \"${MCPGATE_TEST_UNSET}\"}\ncache: {redis: [\"a:1\", \"${MCPGATE_TEST_UNSET}:2\"]}\n", []string{
		`m.yaml:3: store.redis: environment variable MCPGATE_TEST_UNSET is not set (a Redis address must not expand to nothing)`,
		`m.yaml:4: cache.redis[1]: environment variable MCPGATE_TEST_UNSET is not set (a Redis address must not expand to nothing)`,
	}},
	{"unterminated reference", "upstream: {url: \"http://${HOST/mcp\"}\nauth: {jwt: {jwks_file: j.json}}\n", []string{
		`m.yaml:1: upstream.url: unterminated ${ (write $${ for a literal ${)`,
	}},
}

func TestBadWholeConfigs(t *testing.T) {
	t.Setenv("MCPGATE_TEST_SET", "secret-value")
	os.Unsetenv("MCPGATE_TEST_UNSET")
	for _, tc := range badWhole {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("m.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if got, want := err.Error(), strings.Join(tc.want, "\n"); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// A Redis address may come from the environment (a password kept in a
// Kubernetes Secret): it is expanded, and never shown in a problem.
func TestRedisFromEnvironment(t *testing.T) {
	t.Setenv("MCPGATE_TEST_REDIS_PASSWORD", "s3cret")
	cfg, err := Parse("m.yaml", []byte("upstream: {url: \"http://u/mcp\"}\nauth: {jwt: {jwks_file: j.json}}\nstore: {redis: \"redis://app:${MCPGATE_TEST_REDIS_PASSWORD}@10.0.0.1:6379/0\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Store.Redis; len(got) != 1 || got[0] != "redis://app:s3cret@10.0.0.1:6379/0" {
		t.Fatalf("store.redis = %q", got)
	}
	t.Setenv("MCPGATE_TEST_REDIS_PASSWORD", "")
	_, err = Parse("m.yaml", []byte("upstream: {url: \"http://u/mcp\"}\nauth: {jwt: {jwks_file: j.json}}\nstore: {redis: \"${MCPGATE_TEST_REDIS_PASSWORD}\"}\n"))
	if err == nil || !strings.Contains(err.Error(), "expands to an empty string") {
		t.Fatalf("an address expanding to nothing: %v", err)
	}
}

// Values at the stores' bounds are accepted, and reach the config as
// written.
func TestValuesAtTheStoresBounds(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head+`
tiers: {free: {monthly_quota: 1125899906842624}}
tools: {t: {cost: 1125899906842624}, u: {cost: {estimate: 1125899906842624, from_result: _meta.cost}}}
breaker: {consecutive_failures: 3, identical_calls: {count: 2, within: 9600h}, cooldown: 9600h, max_cooldown: 9600h}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tiers["free"].MonthlyQuota != limit.MaxUsage || c.Tools["t"].Cost.Fixed != limit.MaxUsage || c.Tools["u"].Cost.Estimate != limit.MaxUsage {
		t.Errorf("amounts: quota %d, cost %+v, %+v", c.Tiers["free"].MonthlyQuota, c.Tools["t"].Cost, c.Tools["u"].Cost)
	}
	if b := c.Breaker; b.Cooldown != limit.MaxBreakerDuration || b.MaxCooldown != limit.MaxBreakerDuration || b.IdenticalCalls.Within != limit.MaxBreakerDuration {
		t.Errorf("breaker: %+v", b)
	}
}

// A Redis password never appears in a problem, however the address is
// wrong: the value is expanded, so the password may come from a Secret,
// and problems reach `mcpgate check`, the log of a SIGHUP reload and the
// answer of POST /admin/reload. (url.Parse quotes the whole URL in its
// errors, and a bad escape a piece of it.)
func TestRedisPasswordNeverPrinted(t *testing.T) {
	const secret = "Sup3rS3cret"
	t.Setenv("MCPGATE_TEST_REDIS_URL", "redis://default:"+secret+"@redis.internal:6379/zero")
	for _, tc := range []struct{ name, redis, want string }{
		{"bad database", "${MCPGATE_TEST_REDIS_URL}",
			`bad Redis URL "redis://default:xxxxx@redis.internal:6379/zero": invalid database number: "zero"`},
		{"bad database, written in the file", "redis://default:" + secret + "@redis.internal:6379/zero",
			`bad Redis URL "redis://default:xxxxx@redis.internal:6379/zero": invalid database number: "zero"`},
		{"bad escape in the password", "redis://default:" + secret + "%zz@redis.internal:6379/0",
			`bad Redis URL "redis://xxxxx@redis.internal:6379/0": bad user info (a password must percent-encode the characters URLs reserve, such as % @ : / ?)`},
		{"bad escape in the password, and in the path", "redis://default:" + secret + "%zz@redis.internal:6379/%zz",
			`bad Redis URL "redis://xxxxx@redis.internal:6379/%zz": invalid URL escape "%zz"`},
		{"bad escape without a password", "redis://redis.internal:6379/%zz",
			`bad Redis URL "redis://redis.internal:6379/%zz": invalid URL escape "%zz"`},
		{"address without a scheme", "default:" + secret + "@redis.internal:6379",
			`bad Redis address "xxxxx@redis.internal:6379": want redis://host:6379/0, rediss://user:pass@host:6380, unix:///path or host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, section := range []string{"store", "cache"} {
				_, err := Parse("m.yaml", []byte(head+section+": {redis: \""+tc.redis+"\"}\n"))
				want := "m.yaml:3: " + section + ".redis: " + tc.want
				if err == nil || err.Error() != want {
					t.Errorf("got:\n%v\nwant:\n%s", err, want)
				}
			}
		})
	}
}

func TestTooManyProblems(t *testing.T) {
	var b strings.Builder
	b.WriteString(head)
	for i := 0; i < maxErrors+50; i++ {
		b.WriteString("k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "_" + itoa(i) + ": 1\n")
	}
	_, err := Parse("m.yaml", []byte(b.String()))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("err = %v", err)
	}
	if len(es) != maxErrors+1 || es[len(es)-1].Msg != "too many problems; stopped here" {
		t.Errorf("%d problems, last %v", len(es), es[len(es)-1])
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
