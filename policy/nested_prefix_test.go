package policy

import (
	"strings"
	"testing"
)

// A prefix that starts with another upstream's is accepted (calls go to
// the longest), but a scope granting the shorter prefix's tools grants
// the longer one's too: Parse warns, on the longer prefix's line, whether
// it is written or the default of a name ("search__admin" → "search__admin__").
func TestNestedPrefixesWarn(t *testing.T) {
	for name, c := range map[string]struct {
		file string
		want string // "" for no warning
	}{
		"default prefixes": {file: `
upstreams:
  - {name: search, url: http://s/mcp}
  - {name: search--admin, url: http://a/mcp, prefix: search__admin__}
`, want: `m.yaml:4: upstreams[1].prefix: prefix "search__admin__" starts with the prefix "search__" of upstreams[0]`},
		"written, longer first": {file: `
upstreams:
  - {name: b, url: http://b/mcp, prefix: ab}
  - {name: a, url: http://a/mcp, prefix: a}
`, want: `m.yaml:3: upstreams[0].prefix: prefix "ab" starts with the prefix "a" of upstreams[1]`},
		"disjoint": {file: `
upstreams:
  - {name: search, url: http://s/mcp}
  - {name: files, url: http://f/mcp}
  - {name: bare, url: http://b/mcp, prefix: ""}
`},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse("m.yaml", []byte(upHead+strings.TrimPrefix(c.file, "\n")))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == "" && len(cfg.Warnings) != 0:
				t.Errorf("warnings %q, want none", cfg.Warnings)
			case c.want != "" && (len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0], c.want)):
				t.Errorf("warnings %q, want one starting %q", cfg.Warnings, c.want)
			}
		})
	}
}
