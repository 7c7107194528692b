package policy

import "gopkg.in/yaml.v3"

// DenyMode says how a denied tools/call (rate limit, quota or loop breaker)
// is answered. The zero value "" means "not set here": Config.DenyAs then
// looks further and falls back to DenyHTTP.
type DenyMode string

// The deny modes.
const (
	// DenyHTTP answers 429 with a JSON-RPC error (code -33029, the retry
	// data in error.data): the gateway's contract, and the default.
	DenyHTTP DenyMode = "http"
	// DenyResult answers 200 with a tools/call result that says isError:
	// true, a text for the model naming the limit and the retry time, and
	// the retry data as structuredContent. The rate-limit headers are set
	// as for DenyHTTP. MCP SDK clients (Go, TypeScript) do not read the
	// body of a 429, so only this mode lets the model learn when to retry.
	// Requests other than tools/call have no result to carry a denial and
	// are always denied with 429.
	DenyResult DenyMode = "result"
)

// Valid reports whether m is one of the deny modes.
func (m DenyMode) Valid() bool { return m == DenyHTTP || m == DenyResult }

// DenyAs returns how a denied tools/call of tool by a caller of tier is
// answered: the tool's deny_as, else the tier's (an unknown tier means
// DefaultTier, as in RulesFor), else DenyHTTP. It never returns "".
func (c *Config) DenyAs(tier, tool string) DenyMode {
	if m := c.Tools[tool].DenyAs; m != "" {
		return m
	}
	if _, t, _ := c.ResolveTier(tier); t.DenyAs != "" {
		return t.DenyAs
	}
	return DenyHTTP
}

// denyAs decodes a deny_as value: "http" or "result".
func (d *decoder) denyAs(v *yaml.Node, p string) DenyMode {
	s, ok := d.str(v, p)
	if !ok {
		return ""
	}
	if m := DenyMode(s); m.Valid() {
		return m
	}
	d.errf(v, p, "unknown deny mode %q (want http or result)", s)
	return ""
}
