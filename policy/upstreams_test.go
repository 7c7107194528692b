package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// upHead makes a config with upstreams valid (given a valid upstreams:
// list); cases append to it from line 2.
const upHead = "auth: {jwt: {hs256_secret_env: SECRET}}\n"

func TestUpstreams(t *testing.T) {
	t.Setenv("MCPGATE_TEST_TOKEN", "tok")
	t.Setenv("MCPGATE_TEST_ROOT", "/data")
	c, err := Parse("m.yaml", []byte(upHead+`
upstream:
  timeout: 45s
  identity_headers: true
upstreams:
  - name: search
    url: http://search.internal/mcp
    headers: {Authorization: "Bearer ${MCPGATE_TEST_TOKEN}"}
    timeout: 30s
  - name: files
    command: ["node", "files-server.mjs", "--root", "${MCPGATE_TEST_ROOT}"]
    env: {LOG_LEVEL: warn, EMPTY: }
    prefix: ""
  - name: a-2
    url: https://a2.example/mcp
    prefix: "v1.x_"
    limits:
      - {name: a2, algorithm: fixed_window, limit: 5, period: 1s}
      - {name: a2_tool, per: subject_tool, algorithm: gcra, limit: 5, period: 1s}
tools:
  search__query: {timeout: 5s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %q", c.Warnings)
	}
	want := []UpstreamServer{
		{Name: "search", URL: "http://search.internal/mcp", Headers: map[string]string{"Authorization": "Bearer tok"}, Timeout: 30 * time.Second, Prefix: "search__"},
		{Name: "files", Command: []string{"node", "files-server.mjs", "--root", "/data"}, Env: map[string]string{"LOG_LEVEL": "warn", "EMPTY": ""}, Timeout: 45 * time.Second},
		{Name: "a-2", URL: "https://a2.example/mcp", Timeout: 45 * time.Second, Prefix: "v1.x_", Limits: []Rule{
			rule("a2", keyspace.PerTenant, limit.FixedWindow, 5, time.Second, 0, false),
			rule("a2_tool", keyspace.PerSubjectTool, limit.GCRA, 5, time.Second, 0, false),
		}},
	}
	if !reflect.DeepEqual(c.Upstreams, want) {
		t.Errorf("upstreams =\n%+v\nwant\n%+v", c.Upstreams, want)
	}
	if c.Upstream.URL != "" || !c.Upstream.IdentityHeaders || c.Upstream.Timeout != 45*time.Second {
		t.Errorf("upstream = %+v", c.Upstream)
	}
	if got := c.Tools["search__query"]; got.Timeout != 5*time.Second || got.Cost != (Cost{Fixed: 1}) {
		t.Errorf("tool = %+v", got)
	}

	// Without upstream:, each timeout defaults to DefaultUpstreamWait.
	c, err = Parse("m.yaml", []byte(upHead+"upstreams: [{name: s, url: http://s/mcp}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if u := c.Upstreams[0]; u.Timeout != DefaultUpstreamWait || u.Prefix != "s__" || u.Headers != nil || u.Env != nil {
		t.Errorf("defaults: %+v", u)
	}
	// An embedded config may have upstreams too.
	if _, err := ParseEmbedded("m.yaml", []byte(upHead+"upstreams: [{name: s, url: http://s/mcp}]\n")); err != nil {
		t.Errorf("ParseEmbedded: %v", err)
	}
}

// upstream.headers are not sent to the servers of upstreams: setting both
// is a warning.
func TestUpstreamHeadersWithUpstreamsWarns(t *testing.T) {
	c, err := Parse("m.yaml", []byte(upHead+"upstream:\n  headers: {X-A: b}\nupstreams: [{name: s, url: http://s/mcp}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`m.yaml:3: upstream.headers: not sent to the servers of upstreams: (give each its own headers)`}
	if !reflect.DeepEqual(c.Warnings, want) {
		t.Errorf("warnings = %q, want %q", c.Warnings, want)
	}
}

var badUpstreams = []struct {
	name, yaml string
	want       []string
}{
	{"upstream.url too", "upstream: {url: http://u/mcp}\nupstreams: [{name: s, url: http://s/mcp}]\n",
		[]string{`m.yaml:3: upstreams: use upstreams: or upstream.url, not both`}},
	{"not a list", "upstreams: {s: {url: http://s/mcp}}\n",
		[]string{`m.yaml:1: upstream.url: required (the MCP server to forward to)`, `m.yaml:2: upstreams: want a list, got a mapping`}},
	{"unknown field", "upstreams:\n  - name: s\n    url: http://s/mcp\n    header: {A: b}\n",
		[]string{`m.yaml:5: upstreams[0].header: unknown field (did you mean "headers"?)`}},
	{"entry not a mapping", "upstreams: [s]\n",
		[]string{`m.yaml:2: upstreams[0]: want a mapping, got the string "s"`}},
	{"null entry", "upstreams:\n  -\n",
		[]string{`m.yaml:3: upstreams[0]: want a mapping (an upstream's settings), got null`}},
	{"missing name", "upstreams:\n  - url: http://s/mcp\n",
		[]string{`m.yaml:3: upstreams[0].name: required`}},
	{"bad names", "upstreams:\n  - {name: Search, url: http://s/mcp}\n  - {name: " + strings.Repeat("a", 64) + ", url: http://s/mcp}\n  - {name: \"\", url: http://s/mcp}\n  - {name: a_b, url: http://s/mcp}\n",
		[]string{
			`m.yaml:3: upstreams[0].name: bad upstream name "Search": use 1 to 63 lowercase letters, digits or '-'`,
			`m.yaml:4: upstreams[1].name: bad upstream name "` + strings.Repeat("a", 64) + `": use 1 to 63 lowercase letters, digits or '-'`,
			`m.yaml:5: upstreams[2].name: bad upstream name "": use 1 to 63 lowercase letters, digits or '-'`,
			`m.yaml:6: upstreams[3].name: bad upstream name "a_b": use 1 to 63 lowercase letters, digits or '-'`,
		}},
	{"duplicate name", "upstreams:\n  - {name: s, url: http://s/mcp}\n  - {name: t, url: http://t/mcp}\n  - {name: s, command: [s], prefix: x_}\n",
		[]string{`m.yaml:5: upstreams[2].name: duplicate upstream name "s" (first at line 3)`}},
	{"neither url nor command", "upstreams:\n  - name: s\n    timeout: 1s\n",
		[]string{`m.yaml:3: upstreams[0]: set url (a Streamable HTTP server) or command (a stdio server mcpgate runs)`}},
	{"both url and command", "upstreams:\n  - name: s\n    url: http://s/mcp\n    command: [s]\n",
		[]string{`m.yaml:5: upstreams[0].command: url is set too: set url (Streamable HTTP) or command (stdio), not both`}},
	{"env with url", "upstreams:\n  - name: s\n    url: http://s/mcp\n    env:\n      A: b\n",
		[]string{`m.yaml:5: upstreams[0].env: only with command (the environment of the process mcpgate runs), and url is set`}},
	{"headers with command", "upstreams:\n  - name: s\n    command: [s]\n    headers: {A: b}\n",
		[]string{`m.yaml:5: upstreams[0].headers: only with url (headers of the HTTP requests), and command is set`}},
	{"bad url", "upstreams:\n  - {name: s, url: \"ftp://s/mcp\"}\n  - {name: t, url: \"\"}\n  - {name: u, url: \"${MCPGATE_TEST_UNSET}\"}\n",
		[]string{
			`m.yaml:3: upstreams[0].url: bad URL "ftp://s/mcp": want http:// or https:// and a host`,
			`m.yaml:4: upstreams[1].url: empty: want the http:// or https:// URL of a Streamable HTTP MCP server`,
			`m.yaml:5: upstreams[2].url: "${MCPGATE_TEST_UNSET}" expands to an empty string`,
		}},
	{"bad headers", "upstreams:\n  - name: s\n    url: http://s/mcp\n    headers: {\"Bad Name\": x, A: a, a: b, B: \"x\\ny\"}\n",
		[]string{
			`m.yaml:5: upstreams[0].headers["Bad Name"]: not a valid HTTP header name`,
			`m.yaml:5: upstreams[0].headers.a: same header as "A" at line 5 (header names ignore case)`,
			`m.yaml:5: upstreams[0].headers.B: value contains a line break or NUL (after ${VAR} expansion)`,
		}},
	{"bad commands", "upstreams:\n  - {name: a, command: []}\n  - {name: b, command: \"node s.mjs\"}\n  - {name: c, command: [\"\", x]}\n  - {name: d, command: [\"${MCPGATE_TEST_UNSET}\"]}\n  - {name: e, command: [x, {a: 1}]}\n",
		[]string{
			`m.yaml:3: upstreams[0].command: empty: give the program and its arguments, e.g. [node, server.mjs]`,
			`m.yaml:4: upstreams[1].command: want a list: the program and its arguments, e.g. [node, server.mjs], got the string "node s.mjs"`,
			`m.yaml:5: upstreams[2].command[0]: the program is empty`,
			`m.yaml:6: upstreams[3].command[0]: the program "${MCPGATE_TEST_UNSET}" expands to an empty string`,
			`m.yaml:7: upstreams[4].command[1]: want a string, got a mapping`,
		}},
	{"bad env", "upstreams:\n  - name: s\n    command: [s]\n    env: {1A: x, B: [1], C-D: y}\n",
		[]string{
			`m.yaml:5: upstreams[0].env.1A: "1A" is not an environment variable name (letters, digits and _, not starting with a digit)`,
			`m.yaml:5: upstreams[0].env.B: want a string, got a list`,
			`m.yaml:5: upstreams[0].env.C-D: "C-D" is not an environment variable name (letters, digits and _, not starting with a digit)`,
		}},
	{"bad timeout and prefix", "upstreams:\n  - name: s\n    url: http://s/mcp\n    timeout: 0s\n    prefix: \"s:\"\n",
		[]string{
			`m.yaml:5: upstreams[0].timeout: must be positive`,
			`m.yaml:6: upstreams[0].prefix: bad prefix "s:": use letters, digits, '_', '.' or '-' ("" exposes bare names)`,
		}},
	{"same prefix, one by default", "upstreams:\n  - {name: a, url: http://a/mcp}\n  - {name: b, url: http://b/mcp, prefix: a__}\n",
		[]string{`m.yaml:4: upstreams[1].prefix: prefix "a__" is also the prefix of upstreams[0] (line 3): their tools would be exposed under the same names`}},
	{"same prefix, the second by default", "upstreams:\n  - {name: b, url: http://b/mcp, prefix: a__}\n  - {name: a, url: http://a/mcp}\n",
		[]string{`m.yaml:4: upstreams[1].prefix: default prefix "a__" is also the prefix of upstreams[0] (line 3): their tools would be exposed under the same names`}},
	{"bare upstreams with limits", "upstreams:\n  - {name: a, url: http://a/mcp, prefix: \"\"}\n  - name: b\n    url: http://b/mcp\n    prefix: \"\"\n    limits: [{name: r, algorithm: gcra, limit: 1, period: 1s}]\n  - {name: c, command: [c], prefix: \"\"}\n",
		[]string{`m.yaml:7: upstreams[1].limits: not allowed on an upstream with prefix "" while another has prefix "" too (upstreams[0], line 3): which of them a bare tool name belongs to is known only at startup; give this upstream a prefix, or put the rules in tools.<name>.limits`}},
	{"limits per global, methods", "upstreams:\n  - name: a\n    url: http://a/mcp\n    limits:\n      - {name: r, per: global, algorithm: gcra, limit: 1, period: 1s}\n      - {name: s, methods: [tools/list], algorithm: gcra, limit: 1, period: 1s}\n",
		[]string{
			`m.yaml:6: upstreams[0].limits[0].per: per global is not allowed here: global rules go in the top-level "global" list`,
			`m.yaml:7: upstreams[0].limits[1].methods: not allowed in an upstream's rules (they count calls of its tools); name methods in a tier's or the global rules`,
		}},
	{"duplicate rule name in an upstream", "upstreams:\n  - name: a\n    url: http://a/mcp\n    limits:\n      - {name: r, algorithm: gcra, limit: 1, period: 1s}\n      - {name: r, per: subject, algorithm: gcra, limit: 1, period: 1s}\n",
		[]string{`m.yaml:7: upstreams[0].limits[1].name: duplicate rule name "r" (first at line 6)`}},
	{"upstream rule shares a tier rule's counter",
		"tiers:\n  free:\n    limits: [{name: r, algorithm: gcra, limit: 1, period: 1s}]\nupstreams:\n  - name: a\n    url: http://a/mcp\n    limits: [{name: r, algorithm: gcra, limit: 1, period: 1s}]\n",
		[]string{`m.yaml:8: upstreams[0].limits[0].name: rule "r" per tenant is also defined in tiers.free.limits[0] (line 4): the two would share one counter; rename one`}},
	{"upstream rule shares a counter with a rule of its tool",
		"tools:\n  a__t:\n    limits: [{name: r, per: tenant_tool, algorithm: gcra, limit: 1, period: 1s}]\nupstreams:\n  - name: a\n    url: http://a/mcp\n    limits: [{name: r, per: tenant_tool, algorithm: gcra, limit: 1, period: 1s}]\n",
		[]string{`m.yaml:8: upstreams[0].limits[0].name: rule "r" per tenant_tool is also defined in tools.a__t.limits[0] (line 4), a tool of this upstream: the two would share one counter; rename one`}},
	{"upstream rules share a counter with different settings",
		"upstreams:\n  - name: a\n    url: http://a/mcp\n    limits: [{name: r, algorithm: gcra, limit: 1, period: 1s}]\n  - name: b\n    url: http://b/mcp\n    limits: [{name: r, algorithm: gcra, limit: 2, period: 1s}]\n",
		[]string{`m.yaml:8: upstreams[1].limits[0].name: rule "r" per tenant shares a counter with upstreams[0].limits[0] (line 5) but has different settings; rules that share a counter must be identical`}},
	{"upstream rule shares a counter with another upstream's tool, differently",
		"tools:\n  b__t:\n    limits: [{name: r, per: subject, algorithm: gcra, limit: 1, period: 1s}]\nupstreams:\n  - name: a\n    url: http://a/mcp\n    limits: [{name: r, per: subject, algorithm: gcra, limit: 2, period: 1s}]\n  - {name: b, url: http://b/mcp}\n",
		[]string{`m.yaml:8: upstreams[0].limits[0].name: rule "r" per subject shares a counter with tools.b__t.limits[0] (line 4) but has different settings; rules that share a counter must be identical`}},
	{"tool timeout", "tools: {t: {timeout: 0s}, u: {timeout: 1s}}\n",
		[]string{`m.yaml:1: upstream.url: required (the MCP server to forward to)`, `m.yaml:2: tools.t.timeout: must be positive`, `m.yaml:2: tools.u.timeout: only with upstreams:`}},
}

func TestBadUpstreams(t *testing.T) {
	for _, tc := range badUpstreams {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("m.yaml", []byte(upHead+tc.yaml))
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			if got, want := err.Error(), strings.Join(tc.want, "\n"); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// Rules of one name where sharing is allowed: identical tenant rules in
// two upstreams and a tool of a third, and per-tool rules of one name in an
// upstream and a tool of another upstream (their keys hold the tool).
func TestUpstreamRulesMayShare(t *testing.T) {
	_, err := Parse("m.yaml", []byte(upHead+`
tools:
  c__t:
    limits:
      - {name: r, per: tenant, algorithm: gcra, limit: 1, period: 1s}
      - {name: q, per: tenant_tool, algorithm: gcra, limit: 9, period: 1s}
upstreams:
  - name: a
    url: http://a/mcp
    limits:
      - {name: r, per: tenant, algorithm: gcra, limit: 1, period: 1s}
      - {name: q, per: tenant_tool, algorithm: gcra, limit: 1, period: 1s}
  - name: b
    url: http://b/mcp
    limits: [{name: r, per: tenant, algorithm: gcra, limit: 1, period: 1s}]
  - {name: c, url: http://c/mcp}
`))
	if err != nil {
		t.Fatal(err)
	}
}

func TestUpstreamOf(t *testing.T) {
	c, err := Parse("m.yaml", []byte(upHead+`
upstreams:
  - {name: a, url: http://a/mcp, prefix: a_}
  - {name: ab, url: http://ab/mcp, prefix: a_b_}
  - {name: search, url: http://s/mcp}
  - {name: files, command: [f], prefix: ""}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tool, want string
		ok         bool
	}{
		{"a_x", "a", true},
		{"a_b_x", "ab", true}, // the longest prefix wins
		{"a_b_", "a", true},   // a name longer than a_b_ only belongs to ab
		{"a_", "files", true}, // not longer than a_: a bare name
		{"search__query", "search", true},
		{"search_query", "files", true},
		{"read", "files", true},
		{"", "", false},
	} {
		name, ok := c.UpstreamOf(tc.tool)
		if name != tc.want || ok != tc.ok {
			t.Errorf("UpstreamOf(%q) = %q, %v; want %q, %v", tc.tool, name, ok, tc.want, tc.ok)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = c.UpstreamOf("a_b_x") }); n != 0 {
		t.Errorf("UpstreamOf allocates %v times", n)
	}

	// No bare upstream, or several: a name no prefix matches has none.
	for _, doc := range []string{
		"upstreams: [{name: a, url: http://a/mcp}]\n",
		"upstreams: [{name: a, url: http://a/mcp, prefix: \"\"}, {name: b, url: http://b/mcp, prefix: \"\"}]\n",
	} {
		c, err := Parse("m.yaml", []byte(upHead+doc))
		if err != nil {
			t.Fatal(err)
		}
		if name, ok := c.UpstreamOf("read"); ok {
			t.Errorf("%s: UpstreamOf(read) = %q", doc, name)
		}
	}
	// A single upstream (upstream.url): none.
	c, err = Parse("m.yaml", []byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := c.UpstreamOf("read"); ok {
		t.Errorf("single upstream: UpstreamOf(read) = %q", name)
	}
}

func TestRulesForUpstreams(t *testing.T) {
	c, err := Parse("m.yaml", []byte(upHead+`
tiers:
  free:
    limits: [{name: f, algorithm: fixed_window, limit: 100, period: 1s}]
  pro:
    limits: [{name: p, algorithm: fixed_window, limit: 1000, period: 1s}]
global:
  - {name: g, algorithm: fixed_window, limit: 1000, period: 1s}
upstreams:
  - name: search
    url: http://s/mcp
    limits: [{name: s, algorithm: token_bucket, limit: 60, period: 1m}]
  - name: files
    command: [files]
    prefix: ""
    limits: [{name: fs, per: subject, algorithm: gcra, limit: 10, period: 1s}]
  - {name: plain, url: http://p/mcp}
tools:
  search__query:
    limits: [{name: q, algorithm: concurrency, limit: 2, period: 1m}]
  read: {cost: 2}
  other__x:
    limits: [{name: o, algorithm: concurrency, limit: 1, period: 1m}]
`))
	if err != nil {
		t.Fatal(err)
	}
	f := rule("f", keyspace.PerTenant, limit.FixedWindow, 100, time.Second, 0, false)
	p := rule("p", keyspace.PerTenant, limit.FixedWindow, 1000, time.Second, 0, false)
	g := rule("g", keyspace.PerGlobal, limit.FixedWindow, 1000, time.Second, 0, false)
	s := rule("s", keyspace.PerTenant, limit.TokenBucket, 60, time.Minute, 0, false)
	fs := rule("fs", keyspace.PerSubject, limit.GCRA, 10, time.Second, 0, false)
	q := rule("q", keyspace.PerTenantTool, limit.Concurrency, 2, time.Minute, 0, false)
	o := rule("o", keyspace.PerTenantTool, limit.Concurrency, 1, time.Minute, 0, false)
	for _, tc := range []struct {
		tier, tool string
		want       []Rule
	}{
		{"free", "search__query", []Rule{f, s, q}}, // listed: tier, upstream, tool
		{"pro", "search__query", []Rule{p, s, q}},
		{"free", "search__list", []Rule{f, s}}, // not listed: tier, upstream
		{"pro", "search__list", []Rule{p, s}},
		{"free", "read", []Rule{f, fs}}, // the bare upstream, listed without rules
		{"free", "write", []Rule{f, fs}},
		{"free", "plain__x", []Rule{f}}, // an upstream without limits
		{"free", "other__x", []Rule{f, fs, o}},
		{"unknown", "search__list", []Rule{f, s}},
		{"free", "", []Rule{f}},
	} {
		got, global := c.RulesFor(tc.tier, tc.tool)
		if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(global, []Rule{g}) {
			t.Errorf("RulesFor(%q, %q) = %v, %v; want %v", tc.tier, tc.tool, got, global, tc.want)
		}
		if cap(got) != len(got) {
			t.Errorf("RulesFor(%q, %q) has spare capacity", tc.tier, tc.tool)
		}
		if n := testing.AllocsPerRun(20, func() { _, _ = c.RulesFor(tc.tier, tc.tool) }); n != 0 {
			t.Errorf("RulesFor(%q, %q) allocates %v times", tc.tier, tc.tool, n)
		}
		hand := *c
		hand.rules = nil
		if got2, _ := hand.RulesFor(tc.tier, tc.tool); !reflect.DeepEqual(got2, tc.want) {
			t.Errorf("unindexed RulesFor(%q, %q) = %v", tc.tier, tc.tool, got2)
		}
	}
	// tools/call rules of RulesForMethod are the tier's alone.
	if got, _ := c.RulesForMethod("free", MethodToolsCall); !reflect.DeepEqual(got, []Rule{f}) {
		t.Errorf("RulesForMethod(tools/call) = %v", got)
	}

	// No tiers: the upstream's and the tool's rules.
	c, err = Parse("m.yaml", []byte(upHead+"upstreams: [{name: a, url: http://a/mcp, limits: [{name: s, algorithm: gcra, limit: 1, period: 1s}]}]\ntools: {a__t: {limits: [{name: t, algorithm: gcra, limit: 1, period: 1s}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	as := rule("s", keyspace.PerTenant, limit.GCRA, 1, time.Second, 0, false)
	at := rule("t", keyspace.PerTenantTool, limit.GCRA, 1, time.Second, 0, false)
	if got, _ := c.RulesFor("any", "a__t"); !reflect.DeepEqual(got, []Rule{as, at}) {
		t.Errorf("no tiers, listed tool: %v", got)
	}
	if got, _ := c.RulesFor("any", "a__u"); !reflect.DeepEqual(got, []Rule{as}) {
		t.Errorf("no tiers, unlisted tool: %v", got)
	}
	if got, _ := c.RulesFor("any", "b__u"); got != nil {
		t.Errorf("no tiers, no upstream: %v", got)
	}
}

// With upstreams:, every exposed name is an upstream's prefix and a name
// of its own. A tools.<name> key that no upstream can expose (the tool's
// bare name, a misspelt prefix) configures a tool no client can call: it
// is a warning naming the exposed name it was probably meant to be. With
// an upstream of prefix "", any name may be one of its tools.
func TestToolKeysNoUpstreamExposes(t *testing.T) {
	const two = "upstreams:\n  - {name: search, url: http://s/mcp}\n  - {name: docs, url: http://d/mcp, prefix: d.}\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"bare name, one upstream", "upstreams: [{name: search, url: http://s/mcp}]\ntools:\n  query: {cost: 50}\n  search__query: {cost: 5}\n",
			[]string{`m.yaml:4: tools.query: no upstream exposes this name: with upstreams:, a tool is named <prefix><tool> (prefixes: "search__"); did you mean "search__query"?`}},
		{"bare name, two upstreams", two + "tools: {query: {on_error: closed}}\n",
			[]string{`m.yaml:5: tools.query: no upstream exposes this name: with upstreams:, a tool is named <prefix><tool> (prefixes: "search__", "d."); did you mean one of "search__query", "d.query"?`}},
		{"misspelt prefix", two + "tools: {serch__query: {cost: 2}, search_query: {cost: 2}, d.get: {cost: 2}}\n",
			[]string{
				`m.yaml:5: tools.serch__query: no upstream exposes this name: with upstreams:, a tool is named <prefix><tool> (prefixes: "search__", "d."); did you mean "search__query"?`,
				`m.yaml:5: tools.search_query: no upstream exposes this name: with upstreams:, a tool is named <prefix><tool> (prefixes: "search__", "d."); did you mean "search__query"?`,
			}},
		{"an upstream with prefix \"\"", two + "  - {name: files, command: [f], prefix: \"\"}\ntools: {query: {cost: 2}}\n", nil},
		{"every key exposable", two + "tools: {search__query: {cost: 2}, d.get: {cost: 2}}\n", nil},
		{"no upstreams", "upstream: {url: http://u/mcp}\ntools: {query: {cost: 2}}\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("m.yaml", []byte(upHead+tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Warnings, tc.want) {
				t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(c.Warnings, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
