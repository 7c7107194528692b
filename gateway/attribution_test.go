package gateway

import (
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/policy"
)

// fakeCatalog is a federation's catalog as checkAttribution reads it: tool
// name to the upstream serving it.
type fakeCatalog map[string]string

func (c fakeCatalog) Tools() []string {
	out := make([]string, 0, len(c))
	for t := range c {
		out = append(out, t)
	}
	return out
}

func (c fakeCatalog) UpstreamOf(tool string) (string, bool) {
	up, ok := c[tool]
	return up, ok
}

// A catalog whose names the configuration reads as another upstream's is
// refused when that would misplace limits: at start, and on a reload that
// gives one of the two upstreams limits (checkAttribution runs in Apply).
func TestCheckAttribution(t *testing.T) {
	cfgWith := func(searchLimits string) *policy.Config {
		t.Helper()
		cfg, err := policy.Parse("x.yaml", []byte(`auth: {jwt: {hs256_secret_env: GATEWAY_TEST_SECRET}}
upstreams:
  - name: search
    url: http://127.0.0.1:1/mcp
`+searchLimits+`
  - name: files
    url: http://127.0.0.1:2/mcp
    prefix: ""
`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const limits = `    limits:
      - {name: search_calls, algorithm: fixed_window, limit: 5, period: 1m}`
	sound := fakeCatalog{"search__query": "search", "read": "files"}
	misplaced := fakeCatalog{"search__query": "search", "search__x": "files"} // files' tool reads as search's
	for _, c := range []struct {
		name    string
		cfg     *policy.Config
		catalog fakeCatalog
		refused bool
	}{
		{"sound, limits", cfgWith(limits), sound, false},
		{"misplaced, no limits", cfgWith(""), misplaced, false},
		{"misplaced, limits", cfgWith(limits), misplaced, true},
	} {
		err := checkAttribution(c.cfg, c.catalog)
		if (err != nil) != c.refused || err != nil && !strings.Contains(err.Error(), `"search__x"`) {
			t.Errorf("%s: checkAttribution = %v, want refused %v", c.name, err, c.refused)
		}
	}
}
