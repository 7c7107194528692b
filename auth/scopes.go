package auth

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The prefixes of the scopes that grant something. Any other scope is
// ignored.
const (
	// toolScopePrefix: "tools:<name>" grants one tool, "tools:<prefix>*"
	// the tools whose name starts with prefix, "tools:*" all tools.
	toolScopePrefix = "tools:"
	// resourceScopePrefix: "resources:<glob>" grants the resources whose URI
	// the glob matches (see MatchGlob); "resources:*" grants them all.
	resourceScopePrefix = "resources:"
	// promptScopePrefix: "prompts:<name>" grants one prompt,
	// "prompts:<prefix>*" the prompts whose name starts with prefix,
	// "prompts:*" all prompts.
	promptScopePrefix = "prompts:"
)

// Scopes is what a caller may use, parsed from the scope claim: tools and
// prompts by name or name prefix, resources by URI glob.
//
// The zero value grants nothing: a token without a scope claim can
// authenticate but cannot call a tool, read a resource or get a prompt
// (zero trust), and each kind must be granted on its own ("tools:*" grants
// no resource). A Scopes is immutable once built and safe for concurrent
// use.
type Scopes struct {
	tools     nameSet
	prompts   nameSet
	resources []string // globs, sorted and without duplicates
}

// nameSet is a set of exact names and of name prefixes, or every name.
type nameSet struct {
	all      bool
	names    map[string]struct{}
	prefixes []string // of "<prefix>*" grants: not empty, sorted, without duplicates
}

// add records the grant of a scope's name part: "*" (every name),
// "<prefix>*" (every name starting with prefix) or an exact name.
func (n *nameSet) add(name string) {
	if name == "*" {
		n.all = true
		return
	}
	if prefix, ok := strings.CutSuffix(name, "*"); ok {
		if i, found := slices.BinarySearch(n.prefixes, prefix); !found {
			n.prefixes = slices.Insert(n.prefixes, i, prefix)
		}
		return
	}
	if n.names == nil {
		n.names = make(map[string]struct{})
	}
	n.names[name] = struct{}{}
}

// allows reports whether name is granted. It does not allocate.
func (n nameSet) allows(name string) bool {
	if n.all {
		return true
	}
	if _, ok := n.names[name]; ok {
		return true
	}
	for _, p := range n.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// sorted returns the grants other than "*", as written after the scope's
// kind: exact names, and prefixes with their '*' ("search__*"), sorted.
func (n nameSet) sorted() []string {
	out := make([]string, 0, len(n.names)+len(n.prefixes))
	for name := range n.names {
		out = append(out, name)
	}
	for _, p := range n.prefixes {
		out = append(out, p+"*")
	}
	slices.Sort(out)
	return out
}

// ParseScopes parses a space-separated scope string (RFC 6749 §3.3):
//
//   - "tools:<name>" grants the tool called name, "tools:*" every tool;
//   - "tools:<prefix>*", with a non-empty prefix, grants every tool whose
//     name starts with prefix: "tools:search__*" grants "search__query"
//     (the tools an upstream exposes under its prefix);
//   - "prompts:<name>" grants the prompt called name, "prompts:<prefix>*"
//     every prompt whose name starts with prefix, "prompts:*" every prompt;
//   - "resources:<glob>" grants every resource whose URI the glob matches
//     (MatchGlob: '*' matches any run of characters, '/' included), so
//     "resources:*" grants every resource and "resources:file:///docs/*"
//     everything under file:///docs/.
//
// Names, prefixes and URIs are matched exactly (case-sensitive), as MCP
// names them. A '*' is a wildcard only at the end of a tool or prompt
// scope, where it matches any run of characters, empty or not (so a name
// that itself ends in '*' cannot be granted alone); elsewhere it is part of
// the name. Any other scope, including a bare "tools:", "prompts:" or
// "resources:", is ignored.
//
// Scopes are separated by ASCII white space (RFC 6749 §3.3 names a space;
// tabs and line breaks are taken too). Any other space or control
// character is part of a scope, which it makes invalid, and ignored: split
// on U+00A0 or U+2028, as strings.Fields would, one scope value
// "tools:echo\u00a0tools:*" that a conforming reader takes for a single
// unknown scope would grant every tool here.
func ParseScopes(s string) Scopes {
	return parseScopeList(splitScopes(s))
}

// splitScopes splits a scope value on ASCII white space.
func splitScopes(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f'
	})
}

// validScope reports whether s holds no space or control character: such
// a scope is invalid (RFC 6749 §3.3: printable characters), and grants
// nothing.
func validScope(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError
	})
}

// parseScopeList builds Scopes from scopes already split, as in the JSON array
// form of the claim that some identity providers issue ("scp").
func parseScopeList(list []string) Scopes {
	var sc Scopes
	for _, s := range list {
		if !validScope(s) {
			continue
		}
		if name, ok := strings.CutPrefix(s, toolScopePrefix); ok && name != "" {
			sc.tools.add(name)
		} else if name, ok := strings.CutPrefix(s, promptScopePrefix); ok && name != "" {
			sc.prompts.add(name)
		} else if glob, ok := strings.CutPrefix(s, resourceScopePrefix); ok && glob != "" {
			sc.resources = append(sc.resources, glob)
		}
	}
	slices.Sort(sc.resources)
	sc.resources = slices.Compact(sc.resources)
	return sc
}

// AllowsTool reports whether the caller may see and call the tool called name.
func (s Scopes) AllowsTool(name string) bool { return s.tools.allows(name) }

// AllowsPrompt reports whether the caller may see and get the prompt called
// name.
func (s Scopes) AllowsPrompt(name string) bool { return s.prompts.allows(name) }

// AllowsResource reports whether the caller may see and read the resource
// at uri: whether one of its "resources:" globs matches uri. Globs match
// text, not paths, so a URI that an upstream could resolve to another path
// than the one it spells (see AmbiguousURI: "file:///docs/../etc/passwd")
// is allowed only by "resources:*", which allows everything anyway.
func (s Scopes) AllowsResource(uri string) bool {
	if AmbiguousURI(uri) {
		return slices.Contains(s.resources, "*")
	}
	for _, g := range s.resources {
		if MatchGlob(g, uri) {
			return true
		}
	}
	return false
}

// AmbiguousURI reports whether uri could name, once an upstream resolves
// it, a resource another glob than its text suggests: it has a dot segment
// ("." or ".." between slashes, RFC 3986 §5.2.4), raw or percent-encoded
// (%2e), an encoded slash or backslash (%2f, %5c), a backslash, a NUL
// (%00) or any control character, anywhere in it, query and fragment
// included. Such URIs have a normalised spelling a client can send
// instead; refusing them keeps "resources:file:///docs/*" inside /docs/.
// Control characters count because WHATWG URL parsers (the TypeScript
// SDK's new URL) delete tab, LF and CR: "/docs/.\t./secret" is
// "/docs/../secret" to them.
func AmbiguousURI(uri string) bool {
	if strings.ContainsFunc(uri, func(r rune) bool { return r == '\\' || r < 0x20 || r == 0x7f }) {
		return true
	}
	lower := strings.ToLower(uri)
	for _, enc := range []string{"%2f", "%5c", "%00"} {
		if strings.Contains(lower, enc) {
			return true
		}
	}
	// Dot segments, with %2e decoded: split the URI on '/' and look for a
	// segment of only dots ("." or ".."), in the query and fragment too: an
	// upstream that joins the text after the scheme to a root as a path
	// ("file:///docs/x?/../../secret") would resolve them. '?' and '#' end
	// a segment too: the path of "file:///docs/..?x" is "/docs/..".
	rest := strings.ReplaceAll(lower, "%2e", ".")
	for seg := range strings.FieldsFuncSeq(rest, func(r rune) bool { return r == '/' || r == '?' || r == '#' }) {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// AllowsResourceTemplate reports whether the caller may see the resource
// template tmpl (an RFC 6570 URI template, as resources/templates/list
// lists them). It errs on the side of hiding: a template is shown only when
// every URI it can expand to is allowed, which is decided from its literal
// prefix, the text before its first '{':
//
//   - a template without '{' is one URI, shown if AllowsResource allows it;
//   - otherwise it is shown if the caller holds a glob made of a literal L
//     and one final '*' (such as "*" or "file:///docs/*") where L is a
//     prefix of the template's literal prefix: every expansion starts with
//     that prefix, so the glob matches them all.
//
// Other globs ("file:///*.md", "*/docs/*") may allow some expansions but do
// not show the template; the resources they allow can still be read.
func (s Scopes) AllowsResourceTemplate(tmpl string) bool {
	prefix, _, expands := strings.Cut(tmpl, "{")
	if !expands {
		return s.AllowsResource(tmpl)
	}
	if AmbiguousURI(prefix) {
		// Every expansion is refused by AllowsResource but under "*".
		return slices.Contains(s.resources, "*")
	}
	for _, g := range s.resources {
		lit, ok := strings.CutSuffix(g, "*")
		if ok && !strings.Contains(lit, "*") && strings.HasPrefix(prefix, lit) {
			return true
		}
	}
	return false
}

// AllTools reports whether the scopes hold "tools:*".
func (s Scopes) AllTools() bool { return s.tools.all }

// Tools returns the tool grants other than "tools:*", sorted: names
// ("tools:<name>" gives name) and prefixes with their '*'
// ("tools:search__*" gives "search__*"). It does not reflect "tools:*";
// see AllTools.
func (s Scopes) Tools() []string { return s.tools.sorted() }

// AllPrompts reports whether the scopes hold "prompts:*".
func (s Scopes) AllPrompts() bool { return s.prompts.all }

// Prompts returns the prompt grants other than "prompts:*", sorted, as
// Tools does. It does not reflect "prompts:*"; see AllPrompts.
func (s Scopes) Prompts() []string { return s.prompts.sorted() }

// Resources returns the resource globs granted ("resources:<glob>"),
// sorted, "*" included when granted.
func (s Scopes) Resources() []string { return slices.Clone(s.resources) }

// String returns the scopes in canonical form: space-separated, tools then
// prompts then resources, each kind sorted with its "*" first when present.
// Scopes that ParseScopes ignores are not kept, so the result can differ
// from the claim.
func (s Scopes) String() string {
	var parts []string
	for _, k := range []struct {
		prefix string
		set    nameSet
	}{{toolScopePrefix, s.tools}, {promptScopePrefix, s.prompts}} {
		if k.set.all {
			parts = append(parts, k.prefix+"*")
		}
		for _, name := range k.set.sorted() {
			parts = append(parts, k.prefix+name)
		}
	}
	for _, g := range s.resources {
		parts = append(parts, resourceScopePrefix+g)
	}
	return strings.Join(parts, " ")
}

// MatchGlob reports whether glob matches s entirely. In a glob, '*' matches
// any run of characters, empty or not, '/' included; every other character,
// '?', '[' and '\' among them, matches only itself (there is no escape, so
// a glob cannot match a literal '*' alone). Matching works on bytes and is
// case-sensitive. It runs in time linear in len(glob)+len(s) times the
// number of '*' at most, without backtracking.
func MatchGlob(glob, s string) bool {
	parts := strings.Split(glob, "*")
	if len(parts) == 1 {
		return glob == s
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	// Between the fixed head and tail, taking each middle part at its
	// leftmost occurrence is optimal: it leaves the most room for the rest.
	mid := s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(mid, p)
		if i < 0 {
			return false
		}
		mid = mid[i+len(p):]
	}
	return true
}
