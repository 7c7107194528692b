package auth

import (
	"slices"
	"strings"
)

// toolScopePrefix starts every scope that grants a tool: "tools:<name>" grants
// one tool and "tools:*" grants them all.
const toolScopePrefix = "tools:"

// Scopes is the set of tools a caller may use, parsed from the scope claim.
//
// The zero value grants no tool: a token without a scope claim can
// authenticate but cannot call anything (zero trust). A Scopes is immutable
// once built and safe for concurrent use.
type Scopes struct {
	all   bool
	tools map[string]struct{}
}

// ParseScopes parses a space-separated scope string (RFC 6749 §3.3). "tools:*"
// grants every tool and "tools:<name>" grants the tool called name; any other
// scope, including a bare "tools:", is ignored. Tool names are matched exactly
// (case-sensitive), as MCP names tools.
func ParseScopes(s string) Scopes {
	return parseScopeList(strings.Fields(s))
}

// parseScopeList builds Scopes from scopes already split, as in the JSON array
// form of the claim that some identity providers issue ("scp").
func parseScopeList(list []string) Scopes {
	var sc Scopes
	for _, s := range list {
		name, ok := strings.CutPrefix(s, toolScopePrefix)
		if !ok || name == "" {
			continue
		}
		if name == "*" {
			sc.all = true
			continue
		}
		if sc.tools == nil {
			sc.tools = make(map[string]struct{})
		}
		sc.tools[name] = struct{}{}
	}
	return sc
}

// AllowsTool reports whether the caller may see and call the tool called name.
func (s Scopes) AllowsTool(name string) bool {
	if s.all {
		return true
	}
	_, ok := s.tools[name]
	return ok
}

// AllTools reports whether the scopes hold "tools:*".
func (s Scopes) AllTools() bool { return s.all }

// Tools returns the tools granted one by one ("tools:<name>"), sorted. It does
// not reflect "tools:*"; see AllTools.
func (s Scopes) Tools() []string {
	out := make([]string, 0, len(s.tools))
	for name := range s.tools {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// String returns the tool scopes in canonical form: space-separated, sorted,
// with "tools:*" first when present. Scopes that ParseScopes ignores are not
// kept, so the result can differ from the claim.
func (s Scopes) String() string {
	var parts []string
	if s.all {
		parts = append(parts, toolScopePrefix+"*")
	}
	for _, name := range s.Tools() {
		parts = append(parts, toolScopePrefix+name)
	}
	return strings.Join(parts, " ")
}
