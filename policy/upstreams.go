package policy

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

var (
	upstreamNameRE = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)
	prefixRE       = regexp.MustCompile(`^[A-Za-z0-9_.\-]*$`)
)

// fieldRef is where a field was given, for checks made once everything is
// decoded.
type fieldRef struct {
	node *yaml.Node
	path string
}

// toolRef is where a tools.<name> key was given.
type toolRef struct {
	name string
	fieldRef
}

// upstreamRef remembers where an entry of upstreams: was defined.
type upstreamRef struct {
	node   *yaml.Node // the entry
	path   string     // "upstreams[i]"
	name   *yaml.Node // the name's value; nil when missing
	nameOK bool       // the name is valid and not a duplicate
	prefix *yaml.Node // the prefix's value; nil when defaulted
	limits *yaml.Node // the limits key; nil when not given
	rules  []ruleRef  // the valid rules of limits
}

func (d *decoder) upstream(n *yaml.Node, path string, u *Upstream) {
	d.object(n, path, fields{
		"url": func(v *yaml.Node, p string) {
			d.upstreamURLAt = v
			if s, ok := d.str(v, p); ok {
				u.URL = d.upstreamURL(v, p, s)
			}
		},
		"headers": func(v *yaml.Node, p string) {
			u.Headers = d.headers(v, p)
			if len(u.Headers) > 0 {
				d.upstreamHeadersAt = &fieldRef{d.keyOf(n, "headers", v), p}
			}
		},
		"identity_headers": func(v *yaml.Node, p string) { u.IdentityHeaders, _ = d.bool(v, p) },
		"max_body_bytes":   func(v *yaml.Node, p string) { u.MaxBodyBytes, _ = d.positiveInt64(v, p) },
		"timeout":          func(v *yaml.Node, p string) { u.Timeout, _ = d.callDuration(v, p, true) },
		"max_duration": func(v *yaml.Node, p string) {
			if x, ok := d.callDuration(v, p, false); ok {
				u.MaxDuration = x
			}
		},
	})
}

// upstreamURL expands ${VAR}s in the URL s of an upstream and checks the
// result: http or https and a host. "" (nothing, or unset variables) is
// returned without a problem; the caller decides whether it is one.
func (d *decoder) upstreamURL(n *yaml.Node, path, s string) string {
	out, unset := d.expand(n, path, s)
	if out != "" && !checkHTTPURL(out) {
		// Print what the file says: the expansion may hold a secret.
		note := ""
		if len(unset) > 0 {
			note = fmt.Sprintf(" (not set: %s)", strings.Join(unset, ", "))
		}
		d.errf(n, path, "bad URL %q%s: want http:// or https:// and a host", redact(s), note)
		return ""
	}
	return out
}

// headers decodes a mapping of HTTP header names to values (${VAR}
// expanded): upstream.headers and upstreams[].headers. Names are checked,
// and compared ignoring case; a null value is "".
func (d *decoder) headers(n *yaml.Node, path string) map[string]string {
	ps, _ := d.mapping(n, path)
	out := make(map[string]string, len(ps))
	seen := map[string]*yaml.Node{}
	for _, e := range ps {
		hp := join(path, e.name)
		if !validHeaderName(e.name) {
			d.errf(e.key, hp, "not a valid HTTP header name")
			continue
		}
		if first := seen[strings.ToLower(e.name)]; first != nil {
			d.errf(e.key, hp, "same header as %q at line %d (header names ignore case)", first.Value, first.Line)
			continue
		}
		seen[strings.ToLower(e.name)] = e.key
		s, ok := d.expandedValue(e.val, hp)
		if !ok {
			continue
		}
		if strings.ContainsAny(s, "\r\n\x00") {
			d.errf(e.val, hp, "value contains a line break or NUL (after ${VAR} expansion)")
			continue
		}
		out[e.name] = s
	}
	return out
}

// expandedValue decodes the string value of a mapping entry and expands its
// ${VAR}s; null is "".
func (d *decoder) expandedValue(n *yaml.Node, path string) (string, bool) {
	val := d.deref(n)
	if val == nil {
		return "", false
	}
	s := ""
	if !isNull(val) {
		var ok bool
		if s, ok = d.str(val, path); !ok {
			return "", false
		}
	}
	s, _ = d.expand(val, path, s)
	return s, true
}

// upstreams decodes the top-level upstreams: list and checks its entries
// against each other.
func (d *decoder) upstreams(n *yaml.Node, path string) []UpstreamServer {
	var out []UpstreamServer
	d.list(n, path, func(_ int, v *yaml.Node, p string) {
		if u, ref, ok := d.upstreamServer(v, p); ok {
			out = append(out, u)
			d.upstreamAt = append(d.upstreamAt, ref)
		}
	})
	if n.Kind == yaml.SequenceNode && len(n.Content) > 0 {
		d.upstreamsGiven = true
	}
	d.checkUpstreams(out, d.upstreamAt[len(d.upstreamAt)-len(out):])
	return out
}

// upstreamServer decodes one entry of upstreams:. ok is false when it is
// not a mapping. A field's problems are reported as its value is read, then
// a missing name, then the first conflict of url, command, env and headers.
func (d *decoder) upstreamServer(n *yaml.Node, path string) (u UpstreamServer, ref upstreamRef, ok bool) {
	ref = upstreamRef{node: n, path: path}
	if isNull(n) {
		d.errf(n, path, "want a mapping (an upstream's settings), got null")
		return u, ref, false
	}
	var t transportAt
	d.object(n, path, fields{
		"name": func(v *yaml.Node, p string) {
			ref.name = v
			u.Name, ref.nameOK = d.upstreamName(v, p)
		},
		"url": func(v *yaml.Node, p string) {
			t.url = v
			u.URL = d.serverURL(v, p)
		},
		"command": func(v *yaml.Node, p string) {
			t.command = v
			u.Command = d.command(v, p)
		},
		"env": func(v *yaml.Node, p string) {
			t.env = d.keyOf(n, "env", v)
			u.Env = d.env(v, p)
		},
		"headers": func(v *yaml.Node, p string) {
			t.headers = d.keyOf(n, "headers", v)
			u.Headers = d.headers(v, p)
		},
		"timeout": func(v *yaml.Node, p string) { u.Timeout, _ = d.callDuration(v, p, true) },
		"prefix": func(v *yaml.Node, p string) {
			ref.prefix = v
			u.Prefix = d.matching(v, p, prefixRE, "bad prefix %q: use letters, digits, '_', '.' or '-' (\"\" exposes bare names)")
		},
		"limits": func(v *yaml.Node, p string) {
			ref.limits = d.keyOf(n, "limits", v)
			u.Limits = d.rules(v, p, scopeUpstream)
			ref.rules = d.lastRules
		},
	})
	if n.Kind != yaml.MappingNode {
		return u, ref, false
	}
	if ref.prefix == nil {
		u.Prefix = u.Name + "__"
	}
	if ref.name == nil {
		d.errf(n, join(path, "name"), "required")
	}
	d.checkTransport(n, path, t)
	return u, ref, true
}

// transportAt is where an entry of upstreams: gave the fields that choose
// and configure how mcpgate reaches the server; nil when not given.
type transportAt struct {
	url     *yaml.Node // the value
	command *yaml.Node // the value
	env     *yaml.Node // the key, else the value
	headers *yaml.Node // the key, else the value
}

// upstreamName decodes the name of an entry of upstreams:. ok is false
// when it is not a string or breaks upstreamNameRE (reported); the name is
// then "".
func (d *decoder) upstreamName(v *yaml.Node, p string) (name string, ok bool) {
	s, ok := d.str(v, p)
	if !ok {
		return "", false
	}
	if !upstreamNameRE.MatchString(s) {
		d.errf(v, p, "bad upstream name %q: use 1 to 63 lowercase letters, digits or '-'", s)
		return "", false
	}
	return s, true
}

// serverURL decodes the url of an entry of upstreams:. An empty URL, or
// one that expands to nothing, is reported here at its value (upstream.url
// leaves that to check), unless expanding or checking it was reported
// already. A problem gives "".
func (d *decoder) serverURL(v *yaml.Node, p string) string {
	s, ok := d.str(v, p)
	if !ok {
		return ""
	}
	errs := len(d.errs)
	out := d.upstreamURL(v, p, s)
	switch {
	case out != "" || len(d.errs) != errs:
	case strings.Contains(s, "${"):
		d.errf(v, p, "%q expands to an empty string", s)
	default:
		d.errf(v, p, "empty: want the http:// or https:// URL of a Streamable HTTP MCP server")
	}
	return out
}

// checkTransport reports the first problem with the fields t of entry n of
// upstreams:. Exactly one of url and command must be set; env goes only
// with command, headers only with url.
func (d *decoder) checkTransport(n *yaml.Node, path string, t transportAt) {
	switch {
	case t.url == nil && t.command == nil:
		d.errf(n, path, "set url (a Streamable HTTP server) or command (a stdio server mcpgate runs)")
	case t.url != nil && t.command != nil:
		d.errf(d.keyOf(n, "command", t.command), join(path, "command"), "url is set too: set url (Streamable HTTP) or command (stdio), not both")
	case t.env != nil && t.url != nil:
		d.errf(t.env, join(path, "env"), "only with command (the environment of the process mcpgate runs), and url is set")
	case t.headers != nil && t.command != nil:
		d.errf(t.headers, join(path, "headers"), "only with url (headers of the HTTP requests), and command is set")
	}
}

// keyOf returns the key node of k in mapping n, else fallback (a key
// brought in by a merge).
func (d *decoder) keyOf(n *yaml.Node, k string, fallback *yaml.Node) *yaml.Node {
	if key, _ := find(n, k); key != nil {
		return key
	}
	return fallback
}

// command decodes a stdio upstream's argv: a non-empty list of strings,
// each ${VAR} expanded, the first (the program) not empty.
func (d *decoder) command(n *yaml.Node, path string) []string {
	if n.Kind != yaml.SequenceNode {
		d.errf(n, path, "want a list: the program and its arguments, e.g. [node, server.mjs], got %s", describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		d.errf(n, path, "empty: give the program and its arguments, e.g. [node, server.mjs]")
		return nil
	}
	var out []string
	d.list(n, path, func(i int, v *yaml.Node, p string) {
		s, ok := d.str(v, p)
		if !ok {
			return
		}
		arg, _ := d.expand(v, p, s)
		switch {
		case strings.ContainsRune(arg, 0):
			d.errf(v, p, "contains NUL (after ${VAR} expansion)")
		case i == 0 && arg == "" && strings.Contains(s, "${"):
			d.errf(v, p, "the program %q expands to an empty string", s)
		case i == 0 && arg == "":
			d.errf(v, p, "the program is empty")
		default:
			out = append(out, arg)
		}
	})
	return out
}

// env decodes a stdio upstream's environment: variable names to values
// (${VAR} expanded; null is "").
func (d *decoder) env(n *yaml.Node, path string) map[string]string {
	ps, _ := d.mapping(n, path)
	out := make(map[string]string, len(ps))
	for _, e := range ps {
		ep := join(path, e.name)
		if !envNameRE.MatchString(e.name) {
			d.errf(e.key, ep, "%q is not an environment variable name (letters, digits and _, not starting with a digit)", e.name)
			continue
		}
		s, ok := d.expandedValue(e.val, ep)
		if !ok {
			continue
		}
		if strings.ContainsRune(s, 0) {
			d.errf(e.val, ep, "value contains NUL (after ${VAR} expansion)")
			continue
		}
		out[e.name] = s
	}
	return out
}

// checkUpstreams checks the entries of upstreams: against each other:
// unique names, no two with the same non-empty prefix, and no limits on an
// upstream with prefix "" when another has it too.
func (d *decoder) checkUpstreams(us []UpstreamServer, refs []upstreamRef) {
	names := map[string]int{}
	for i, u := range us {
		if !refs[i].nameOK {
			continue
		}
		if j, ok := names[u.Name]; ok {
			d.errf(refs[i].name, join(refs[i].path, "name"), "duplicate upstream name %q (first at line %d)", u.Name, refs[j].name.Line)
			refs[i].nameOK = false
			continue
		}
		names[u.Name] = i
	}
	prefixes := map[string]int{}
	for i, u := range us {
		r := refs[i]
		if r.prefix == nil && !r.nameOK {
			continue // the default prefix of a bad name: reported already
		}
		if u.Prefix == "" {
			continue
		}
		j, ok := prefixes[u.Prefix]
		if !ok {
			prefixes[u.Prefix] = i
			continue
		}
		at, what := r.prefix, "prefix"
		if at == nil {
			at, what = r.name, "default prefix"
		}
		firstAt := refs[j].prefix
		if firstAt == nil {
			firstAt = refs[j].name
		}
		d.errf(at, join(r.path, "prefix"), "%s %q is also the prefix of %s (line %d): their tools would be exposed under the same names",
			what, u.Prefix, refs[j].path, firstAt.Line)
	}
	d.checkNestedPrefixes(us, refs, prefixes)
	bare, limited := BareLimited(us)
	for _, i := range limited {
		other := bare[0]
		if other == i {
			other = bare[1]
		}
		d.errf(refs[i].limits, join(refs[i].path, "limits"),
			"not allowed on an upstream with prefix \"\" while another has prefix \"\" too (%s, line %d): which of them a bare tool name belongs to is known only at startup; give this upstream a prefix, or put the rules in tools.<name>.limits",
			refs[other].path, refs[other].node.Line)
	}
}

// BareLimited returns, when two or more of us have the prefix "", the
// indexes of those bare upstreams and of the ones among them with limits:
// a bare tool name then reads as none of theirs (Config.UpstreamOf), so
// those limits would count none of its calls. Parse refuses such limits,
// and a reload must too for the upstreams in force. Both are nil when
// fewer than two upstreams are bare.
func BareLimited(us []UpstreamServer) (bare, limited []int) {
	for i, u := range us {
		if u.Prefix == "" {
			bare = append(bare, i)
		}
	}
	if len(bare) < 2 {
		return nil, nil
	}
	for _, i := range bare {
		if len(us[i].Limits) > 0 {
			limited = append(limited, i)
		}
	}
	return bare, limited
}

// checkNestedPrefixes warns of a prefix that starts with another
// upstream's ("search__admin__" and "search__"): calls are attributed to
// the longest, but a scope granting the shorter prefix's tools
// ("tools:search__*") grants every tool of the longer one too, which an
// operator naming one upstream does not expect. prefixes maps each
// non-empty prefix to its first upstream.
func (d *decoder) checkNestedPrefixes(us []UpstreamServer, refs []upstreamRef, prefixes map[string]int) {
	for i, u := range us {
		if u.Prefix == "" || prefixes[u.Prefix] != i {
			continue
		}
		for p, j := range prefixes {
			if p == u.Prefix || !strings.HasPrefix(u.Prefix, p) {
				continue
			}
			at := refs[i].prefix
			if at == nil {
				at = refs[i].name
			}
			d.warnf(at, join(refs[i].path, "prefix"), "prefix %q starts with the prefix %q of %s: the scope \"tools:%s*\" grants this upstream's tools too (give them prefixes neither of which starts the other)",
				u.Prefix, p, refs[j].path, p)
		}
	}
}

// checkUpstreamSections checks upstreams: against the rest of the file.
func (d *decoder) checkUpstreamSections(c *Config, root *yaml.Node) {
	if d.upstreamsGiven && d.upstreamURLAt != nil {
		at := d.upstreamURLAt
		if k, _ := lookup(root, "upstreams"); k != nil {
			at = k
		}
		d.errf(at, "upstreams", "use upstreams: or upstream.url, not both")
	}
	if d.upstreamsGiven && d.upstreamHeadersAt != nil {
		d.warnf(d.upstreamHeadersAt.node, d.upstreamHeadersAt.path, "not sent to the servers of upstreams: (give each its own headers)")
	}
	if !d.upstreamsGiven {
		for _, t := range d.toolTimeoutAt {
			d.errf(t.node, t.path, "only with upstreams:")
		}
		return
	}
	d.checkToolNames(c)
}

// checkToolNames warns about every tools.<name> key that no upstream of
// upstreams: can expose. Each exposes its tools as <prefix><tool>, so when
// no prefix is "" a key that starts with none of them (the tool's bare
// name, a misspelt prefix) configures a tool no client can call: its
// limits, cost, cache and on_error never apply. (An upstream with prefix
// "" may expose any name: then nothing is warned.) It is a warning, like
// an unset ${VAR}: the file still works, and what each upstream lists is
// known only once it is connected.
func (d *decoder) checkToolNames(c *Config) {
	prefixes := make([]string, 0, len(c.Upstreams))
	for _, u := range c.Upstreams {
		if u.Prefix == "" {
			return
		}
		prefixes = append(prefixes, u.Prefix)
	}
	for _, t := range d.toolAt {
		if c.upstreamIndex(t.name) >= 0 {
			continue
		}
		d.warnf(t.node, t.path, "no upstream exposes this name: with upstreams:, a tool is named <prefix><tool> (prefixes: %s); did you mean %s?",
			quoteAll(prefixes), exposedNames(t.name, prefixes))
	}
}

// exposedNames suggests the exposed names that tool, a tools.<name> key
// no upstream can expose, was meant to be: with its misspelt prefix
// corrected when it begins with one (at most one edit per three bytes of
// the prefix: "serch__query" for "search__"), else tool under each prefix.
func exposedNames(tool string, prefixes []string) string {
	best, bestD := "", 0
	for _, p := range prefixes {
		for k := 1; k < len(tool); k++ {
			if d := editDistance(tool[:k], p); d*3 <= len(p) && (best == "" || d < bestD) {
				best, bestD = p+tool[k:], d
			}
		}
	}
	if best != "" {
		return strconv.Quote(best)
	}
	names := make([]string, len(prefixes))
	for i, p := range prefixes {
		names[i] = p + tool
	}
	if len(names) == 1 {
		return strconv.Quote(names[0])
	}
	return "one of " + quoteAll(names)
}

// quoteAll quotes each of ss and joins them with commas.
func quoteAll(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return strings.Join(out, ", ")
}
