package policy

import (
	"errors"
	"strings"
	"testing"
)

// deny_as on a tier applies to its tools; a tool's own deny_as wins over
// any tier's; nothing set anywhere is http; an unknown tier is the default
// tier, as for rules.
func TestDenyAs(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head+`
default_tier: free
tiers:
  free: {deny_as: result}
  pro: {monthly_quota: 10}
  strict: {deny_as: http}
tools:
  echo: {deny_as: http}
  search: {deny_as: result}
  plain: {cost: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		tier, tool string
		want       DenyMode
	}{
		{"free", "other", DenyResult},
		{"free", "plain", DenyResult},
		{"free", "echo", DenyHTTP},
		{"pro", "other", DenyHTTP},
		{"pro", "search", DenyResult},
		{"strict", "search", DenyResult},
		{"strict", "plain", DenyHTTP},
		{"unknown", "plain", DenyResult}, // the default tier's
		{"", "echo", DenyHTTP},
	}
	for _, tc := range cases {
		if got := c.DenyAs(tc.tier, tc.tool); got != tc.want {
			t.Errorf("DenyAs(%q, %q) = %q, want %q", tc.tier, tc.tool, got, tc.want)
		}
	}
	if c.Tiers["free"].DenyAs != DenyResult || c.Tiers["pro"].DenyAs != "" || c.Tools["plain"].DenyAs != "" {
		t.Errorf("tiers %+v tools %+v", c.Tiers, c.Tools)
	}
}

// Without tiers or tools in the file every call is denied with http.
func TestDenyAsDefault(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.DenyAs("free", "echo"); got != DenyHTTP {
		t.Fatalf("DenyAs = %q, want http", got)
	}
}

func TestDenyAsErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"tiers: {free: {deny_as: 429}}\n", `m.yaml:3: tiers.free.deny_as: unknown deny mode "429" (want http or result)`},
		{"tools:\n  echo:\n    deny_as: Result\n", `m.yaml:5: tools.echo.deny_as: unknown deny mode "Result" (want http or result)`},
		{"tools: {echo: {deny_as: \"\"}}\n", `m.yaml:3: tools.echo.deny_as: unknown deny mode "" (want http or result)`},
		{"tiers: {free: {deny_as: [result]}}\n", `m.yaml:3: tiers.free.deny_as: want a string, got a list`},
		{"tiers: {free: {deny_as: true}}\n", `m.yaml:3: tiers.free.deny_as: want a string, got the boolean true (quote it if you mean the text)`},
	}
	for _, tc := range cases {
		_, err := Parse("m.yaml", []byte(head+tc.yaml))
		if err == nil || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: err %v, want an invalid config", tc.yaml, err)
			continue
		}
		if got := strings.TrimSpace(err.Error()); got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.yaml, got, tc.want)
		}
	}
}
