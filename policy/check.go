package policy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"gopkg.in/yaml.v3"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// ruleScope is where a list of rules appears.
type ruleScope int

const (
	scopeGlobal   ruleScope = iota // the top-level global list
	scopeTier                      // tiers.<name>.limits
	scopeTool                      // tools.<name>.limits
	scopeUpstream                  // upstreams[].limits
)

// ruleRef remembers where a rule was defined, for checks across lists.
type ruleRef struct {
	rule Rule
	name *yaml.Node
	path string // of the rule's name field
}

var (
	ruleNameRE = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,64}$`)
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	tagExprRE  = regexp.MustCompile(`^args(\.[A-Za-z0-9_\-]+)+$`)
	resultRE   = regexp.MustCompile(`^[A-Za-z0-9_\-$]+(\.[A-Za-z0-9_\-$]+)*$`)
	tableRE    = regexp.MustCompile(`^[A-Za-z0-9_.\-]{3,255}$`)
)

// rules decodes a list of rules; names must be unique within the list (they
// label decisions and headers, and equal names with equal scopes would
// share one counter).
func (d *decoder) rules(n *yaml.Node, path string, scope ruleScope) []Rule {
	var out []Rule
	var refs []ruleRef
	seen := map[string]*yaml.Node{}
	d.list(n, path, func(_ int, v *yaml.Node, p string) {
		r, name, ok := d.rule(v, p, scope)
		if !ok {
			return
		}
		if first := seen[r.Name]; first != nil {
			d.errf(name, join(p, "name"), "duplicate rule name %q (first at line %d)", r.Name, first.Line)
			return
		}
		seen[r.Name] = name
		out = append(out, r)
		refs = append(refs, ruleRef{r, name, join(p, "name")})
	})
	d.lastRules = refs
	return out
}

// rule decodes one rule. nameNode is the value of its name field (nil when
// n is not a mapping); ok is false when the rule has any problem. A field's
// problems are reported as its value is read, then the missing required
// fields, a misplaced burst and, last and only for a rule without other
// problems, what Rule.Validate finds.
func (d *decoder) rule(n *yaml.Node, path string, scope ruleScope) (r Rule, nameNode *yaml.Node, ok bool) {
	errs := len(d.errs)
	var burstNode *yaml.Node
	set := map[string]bool{}
	// mark records that a required field was given: a null value is not.
	mark := func(k string, fn func(v *yaml.Node, p string)) func(v *yaml.Node, p string) {
		return func(v *yaml.Node, p string) { set[k] = true; fn(v, p) }
	}
	d.object(n, path, fields{
		"name": mark("name", func(v *yaml.Node, p string) {
			nameNode = v
			r.Name = d.matching(v, p, ruleNameRE, "bad rule name %q: use 1 to 64 letters, digits, '_', '-' or '.' (it appears in headers)")
			if isBuiltinRuleName(r.Name) {
				d.errf(v, p, "%q is the name of a built-in rule: it would share that rule's counter for the methods it does not name; rename it (a rule overrides a built-in by naming its methods, whatever its name)", r.Name)
			}
		}),
		"per": func(v *yaml.Node, p string) {
			if s, ok := d.str(v, p); ok {
				r.Per = d.per(v, p, keyspace.Per(s), scope)
			}
		},
		"algorithm": mark("algorithm", func(v *yaml.Node, p string) { r.Algorithm = d.algorithm(v, p) }),
		"limit":     mark("limit", func(v *yaml.Node, p string) { r.Limit = d.ruleLimit(v, p) }),
		"period":    mark("period", func(v *yaml.Node, p string) { r.Period = d.rulePeriod(v, p) }),
		"burst": func(v *yaml.Node, p string) {
			burstNode = v
			r.Burst, _ = d.count(v, p)
		},
		"shadow":  func(v *yaml.Node, p string) { r.Shadow, _ = d.bool(v, p) },
		"methods": func(v *yaml.Node, p string) { r.Methods = d.ruleMethods(v, p, scope) },
	})
	if n.Kind != yaml.MappingNode {
		return r, nil, false
	}
	for _, k := range []string{"name", "algorithm", "limit", "period"} {
		if !set[k] {
			d.errf(n, join(path, k), "required")
		}
	}
	if r.Per == "" {
		r.Per = defaultPer[scope]
	}
	if burstNode != nil && r.Algorithm.Valid() && r.Algorithm != limit.TokenBucket && r.Algorithm != limit.GCRA {
		d.errf(burstNode, join(path, "burst"), "only token_bucket and gcra have a burst (%s would ignore it)", r.Algorithm)
	}
	if len(d.errs) != errs {
		return r, nameNode, false
	}
	return r, nameNode, d.validRule(n, path, r)
}

// defaultPer is the per of a rule that gives none, by the list it is in.
var defaultPer = map[ruleScope]keyspace.Per{
	scopeGlobal:   keyspace.PerGlobal,
	scopeTier:     keyspace.PerTenant,
	scopeTool:     keyspace.PerTenantTool,
	scopeUpstream: keyspace.PerTenant,
}

// matching decodes a string that must match re. One that does not is
// reported (bad formats it with %q) but kept, so that checks across lists
// can still name or compare it; a value that is not a string is "".
func (d *decoder) matching(v *yaml.Node, p string, re *regexp.Regexp, bad string) string {
	s, ok := d.str(v, p)
	if !ok {
		return ""
	}
	if !re.MatchString(s) {
		d.errf(v, p, bad, s)
	}
	return s
}

// algorithm decodes a rule's algorithm; one that is not a string is "". An
// unknown algorithm is reported but kept (it is then not Valid, which
// quiets the checks that depend on it).
func (d *decoder) algorithm(v *yaml.Node, p string) limit.Algorithm {
	s, ok := d.str(v, p)
	if !ok {
		return ""
	}
	a := limit.Algorithm(s)
	if !a.Valid() {
		d.errf(v, p, "unknown algorithm %q (want one of %s)", s, algorithmList())
	}
	return a
}

// ruleLimit decodes a rule's limit: 0 when it is not an integer; a limit
// below 1 is reported but kept.
func (d *decoder) ruleLimit(v *yaml.Node, p string) int64 {
	x, ok := d.int64(v, p)
	if ok && x < 1 {
		d.errf(v, p, "must be at least 1, got %d", x)
	}
	return x
}

// rulePeriod decodes a rule's period: 0 when it is not a duration. A period
// out of limit's range, or not in whole microseconds (the unit in which the
// limiters measure time), is reported but kept.
func (d *decoder) rulePeriod(v *yaml.Node, p string) time.Duration {
	x, ok := d.duration(v, p)
	switch {
	case !ok:
	case x < limit.MinPeriod || x > limit.MaxPeriod:
		d.errf(v, p, "must be between %v and %v, got %v", limit.MinPeriod, limit.MaxPeriod, x)
	case x%time.Microsecond != 0:
		d.errf(v, p, "must be a whole number of microseconds, got %v", x)
	}
	return x
}

// ruleMethods decodes a rule's methods. Only tiers and the global list may
// name methods: the rules of a tool or an upstream count calls of tools,
// so there methods is refused (and nil).
func (d *decoder) ruleMethods(v *yaml.Node, p string, scope ruleScope) []string {
	switch scope {
	case scopeTool:
		d.errf(v, p, "not allowed in a tool's rules (they count calls of that tool); name methods in a tier's or the global rules")
		return nil
	case scopeUpstream:
		d.errf(v, p, "not allowed in an upstream's rules (they count calls of its tools); name methods in a tier's or the global rules")
		return nil
	}
	return d.methods(v, p)
}

// validRule reports whether r, free of decoding problems, passes
// Rule.Validate, reporting its problem at the rule. The rule's name is cut
// from the message: the path already says which rule it is.
func (d *decoder) validRule(n *yaml.Node, path string, r Rule) bool {
	if err := r.Validate(); err != nil {
		msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("%v %q: ", limit.ErrInvalidRule, r.Name))
		d.errf(n, path, "%s", msg)
		return false
	}
	return true
}

// methods decodes a rule's methods: a non-empty list of names from
// RequestMethods, or "*".
func (d *decoder) methods(n *yaml.Node, path string) []string {
	var out []string
	seen := map[string]bool{}
	d.list(n, path, func(i int, v *yaml.Node, p string) {
		s, ok := d.str(v, p)
		switch {
		case !ok:
		case !knownMethod(s):
			d.errf(v, p, "unknown MCP request method %q (want \"*\", %q or one of %s)", s, MethodNotifications, strings.Join(RequestMethods, ", "))
		case seen[s]:
			d.errf(v, p, "method %q is listed twice", s)
		default:
			seen[s] = true
			out = append(out, s)
		}
	})
	if n.Kind == yaml.SequenceNode && len(n.Content) == 0 {
		d.errf(n, path, "empty: list the methods the rule counts, or leave methods out for tools/call")
	}
	return out
}

func algorithmList() string {
	names := make([]string, len(limit.Algorithms))
	for i, a := range limit.Algorithms {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// per checks a rule's scope against the list it is in.
func (d *decoder) per(v *yaml.Node, p string, per keyspace.Per, scope ruleScope) keyspace.Per {
	switch {
	case per == "":
		return ""
	case !per.Valid() && scope == scopeGlobal:
		d.errf(v, p, "unknown per %q (rules in the global list are always per global)", per)
	case !per.Valid():
		d.errf(v, p, "unknown per %q (want one of tenant, tenant_tool, subject, subject_tool)", per)
	case scope == scopeGlobal && per != keyspace.PerGlobal:
		d.errf(v, p, "per %s is not allowed in the global list (global rules count across all tenants); put %s rules in a tier or a tool", per, per)
	case scope != scopeGlobal && per == keyspace.PerGlobal:
		d.errf(v, p, "per global is not allowed here: global rules go in the top-level \"global\" list")
	default:
		return per
	}
	return ""
}

// redis decodes store.redis or cache.redis: "" (nil), one URL or address,
// or a list of Cluster seed addresses.
func (d *decoder) redis(n *yaml.Node, path string) []string {
	if n.Kind == yaml.ScalarNode {
		s, ok := d.str(n, path)
		if !ok || s == "" {
			return nil
		}
		if s, ok = d.expandRedis(n, path, s); !ok {
			return nil
		}
		if !d.checkRedis(n, path, s, true) {
			return nil
		}
		return []string{s}
	}
	if n.Kind != yaml.SequenceNode {
		d.errf(n, path, "want a string or a list of host:port addresses, got %s", describe(n))
		return nil
	}
	var out []string
	one := len(n.Content) == 1
	d.list(n, path, func(_ int, v *yaml.Node, p string) {
		s, ok := d.str(v, p)
		if ok {
			s, ok = d.expandRedis(v, p, s)
		}
		if ok && d.checkRedis(v, p, s, one) {
			out = append(out, s)
		}
	})
	return out
}

// expandRedis expands ${NAME} in a Redis address (a password kept in a
// Kubernetes Secret, say). Unlike in upstream settings, an unset variable is
// an error: an address that expanded to "" would silently turn a shared
// store into an in-process one.
func (d *decoder) expandRedis(n *yaml.Node, path, s string) (string, bool) {
	out, unset := d.expand(n, path, s)
	switch {
	case len(unset) > 0:
		d.errf(n, path, "environment variable %s is not set (a Redis address must not expand to nothing)", unset[0])
		return "", false
	case out == "":
		d.errf(n, path, "%q expands to an empty string (a Redis address must not expand to nothing)", s)
		return "", false
	}
	return out, true
}

func (d *decoder) checkRedis(n *yaml.Node, path, s string, urlOK bool) bool {
	if strings.Contains(s, "://") {
		if !urlOK {
			d.errf(n, path, "a list holds Cluster seed addresses (host:port), not URLs; for TLS or a password use one URL with addr= parameters")
			return false
		}
		if _, err := rueidis.ParseURL(s); err != nil {
			d.errf(n, path, "bad Redis URL %q: %s", redact(s), redisURLProblem(s, err))
			return false
		}
		return true
	}
	if !hostPort(s, false) {
		d.errf(n, path, "bad Redis address %q: want redis://host:6379/0, rediss://user:pass@host:6380, unix:///path or host:port", redact(s))
		return false
	}
	return true
}

// redisURLProblem says what is wrong with the Redis URL s, which
// rueidis.ParseURL refused with err, without a character of its password
// (s is expanded: the password may come from a Secret). err cannot be
// printed as it is: url.Parse quotes the whole URL in its errors, and a bad
// escape a piece of it. So the URL is parsed again with its user info
// hidden: what is still wrong is told from that, and what is not was in the
// user info.
func redisURLProblem(s string, err error) string {
	if r := redact(s); r != s {
		if _, err = rueidis.ParseURL(r); err == nil {
			return "bad user info (a password must percent-encode the characters URLs reserve, such as % @ : / ?)"
		}
	}
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return ue.Err.Error() // without ue.URL
	}
	return strings.TrimPrefix(err.Error(), "redis: ")
}

// redact hides a password in a URL-like string before it is printed: the
// password of a URL, and the whole user info of anything else with an @
// (a URL that does not parse, user:pass@host:port without a scheme).
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	i, j := strings.Index(s, "://"), strings.LastIndexByte(s, '@')
	switch {
	case i >= 0 && j > i:
		return s[:i+3] + "xxxxx" + s[j:]
	case i < 0 && j >= 0:
		return "xxxxx" + s[j:]
	}
	return s
}

// hostPort reports whether s is host:port with a numeric port (0 allowed
// only when zeroOK) and, unless zeroOK, a host.
func hostPort(s string, zeroOK bool) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return false
	}
	return zeroOK || host != "" && p > 0
}

func (d *decoder) checkListen(n *yaml.Node, path, s string) bool {
	if !hostPort(s, true) {
		d.errf(n, path, "bad listen address %q: want host:port (e.g. 127.0.0.1:8080 or :8080)", s)
		return false
	}
	return true
}

// httpURL decodes an http(s) URL; "" is allowed (not set).
func (d *decoder) httpURL(n *yaml.Node, path string) string {
	s, ok := d.str(n, path)
	if !ok || s == "" {
		return ""
	}
	if !checkHTTPURL(s) {
		d.errf(n, path, "bad URL %q: want http:// or https:// and a host", redact(s))
		return ""
	}
	return s
}

func checkHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// checkOrigin accepts "*" or an origin as browsers send it:
// scheme://host[:port], without path, query or user info.
func (d *decoder) checkOrigin(n *yaml.Node, path, s string) bool {
	if s == "*" {
		return true
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		d.errf(n, path, "bad origin %q: want scheme://host[:port] (as a browser sends it) or \"*\"", s)
		return false
	}
	return true
}

func (d *decoder) checkEnvName(n *yaml.Node, path, s string) bool {
	switch {
	case s == "" || envNameRE.MatchString(s):
		return true
	case strings.Contains(s, "$"):
		d.errf(n, path, "want the name of an environment variable (e.g. MCPGATE_JWT_SECRET), not a $ reference")
	default:
		d.errf(n, path, "%q is not an environment variable name (letters, digits and _)", s)
	}
	return false
}

func (d *decoder) checkUsageStore(n *yaml.Node, path, s string) bool {
	kind, target, _ := strings.Cut(s, ":")
	switch {
	case kind == "sqlite" && (strings.TrimPrefix(target, "file:") == ":memory:" || target == "file:" || target == "file://"):
		d.errf(n, path, "sqlite: an in-memory database cannot hold usage (each pooled connection is a database of its own): use a file path")
	case kind == "sqlite" && strings.ContainsRune(target, '?'):
		d.errf(n, path, "sqlite: the path must not contain '?' (connection options are not taken)")
	case kind == "sqlite" && target != "":
		return true
	case kind == "dynamodb" && tableRE.MatchString(target):
		return true
	case kind == "dynamodb":
		d.errf(n, path, "bad DynamoDB table name %q (3 to 255 letters, digits, '_', '-' or '.')", target)
	case kind == "sqlite":
		d.errf(n, path, "sqlite: needs a file path (e.g. sqlite:mcpgate-usage.db)")
	default:
		d.errf(n, path, "unknown usage store %q (want sqlite:PATH or dynamodb:TABLE)", s)
	}
	return false
}

func (d *decoder) checkResultPath(n *yaml.Node, path, s string) bool {
	if !resultRE.MatchString(s) {
		d.errf(n, path, "bad result path %q: want dot-separated field names such as _meta.usage.tokens", s)
		return false
	}
	return true
}

// tags decodes a list of tag templates: text with {{args.<path>}} holes.
func (d *decoder) tags(n *yaml.Node, path string) []string {
	var out []string
	d.list(n, path, func(_ int, v *yaml.Node, p string) {
		s, ok := d.str(v, p)
		if !ok {
			return
		}
		if msg := checkTemplate(s); msg != "" {
			d.errf(v, p, "bad tag %q: %s", s, msg)
			return
		}
		out = append(out, s)
	})
	return out
}

func checkTemplate(s string) string {
	if s == "" {
		return "empty"
	}
	for rest := s; ; {
		i, j := strings.Index(rest, "{{"), strings.Index(rest, "}}")
		switch {
		case i < 0 && j < 0:
			return ""
		case i < 0 || j >= 0 && j < i:
			return `"}}" without "{{"`
		}
		rest = rest[i+2:]
		j = strings.Index(rest, "}}")
		if j < 0 {
			return `"{{" without "}}"`
		}
		if expr := strings.TrimSpace(rest[:j]); !tagExprRE.MatchString(expr) {
			return fmt.Sprintf("{{%s}}: want {{args.NAME}} or {{args.NAME.FIELD}}", rest[:j])
		}
		rest = rest[j+2:]
	}
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7F || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// expand replaces ${NAME} with the environment variable NAME; "$${" is a
// literal "${" and any other '$' is kept. An unset variable expands to ""
// with a warning (a value used only in some deployments should not stop
// `mcpgate check`); unset lists those variables.
func (d *decoder) expand(n *yaml.Node, path, s string) (out string, unset []string) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "$${"):
			b.WriteString("${")
			i += 3
		case strings.HasPrefix(s[i:], "${"):
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				d.errf(n, path, "unterminated ${ (write $${ for a literal ${)")
				return "", nil
			}
			name := s[i+2 : i+2+end]
			if !envNameRE.MatchString(name) {
				d.errf(n, path, "bad variable reference ${%.40s}: want ${NAME} (letters, digits and _)", name)
				return "", nil
			}
			v, ok := os.LookupEnv(name)
			if !ok {
				d.warnf(n, path, "environment variable %s is not set (expands to \"\")", name)
				unset = append(unset, name)
			}
			b.WriteString(v)
			i += 3 + end
		default:
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String(), unset
}

// lookup finds the key and value nodes at keys under n, quietly (problems
// were reported while decoding). Missing: nil, nil.
func lookup(n *yaml.Node, keys ...string) (key, val *yaml.Node) {
	val = n
	for _, k := range keys {
		if val != nil && val.Kind == yaml.AliasNode {
			val = val.Alias
		}
		if val == nil || val.Kind != yaml.MappingNode {
			return nil, nil
		}
		key, val = find(val, k)
		if key == nil {
			return nil, nil
		}
	}
	if val != nil && val.Kind == yaml.AliasNode {
		val = val.Alias
	}
	return key, val
}

func find(m *yaml.Node, k string) (key, val *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Kind == yaml.ScalarNode && m.Content[i].Value == k && m.Content[i].Tag != "!!merge" {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

// check validates what spans sections, once everything is decoded.
func (d *decoder) check(c *Config, root *yaml.Node) {
	at := func(keys ...string) *yaml.Node { // the best node to blame for keys
		for len(keys) > 0 {
			if k, v := lookup(root, keys...); k != nil {
				if v != nil && v.Kind == yaml.ScalarNode {
					return v
				}
				return k
			}
			keys = keys[:len(keys)-1]
		}
		return nil
	}
	// An embedded config (ParseEmbedded) may leave the section out, not
	// give one without its url; with upstreams:, the section holds the
	// settings of every upstream but no url.
	upstreamKey, _ := lookup(root, "upstream")
	if c.Upstream.URL == "" && !d.upstreamsGiven && !d.hasErr("upstream.url") && (!d.embedded || upstreamKey != nil) {
		if _, v := lookup(root, "upstream", "url"); v != nil && strings.Contains(v.Value, "${") {
			d.errf(v, "upstream.url", "required, but %q expands to an empty string", v.Value)
		} else {
			d.errf(at("upstream", "url"), "upstream.url", "required (the MCP server to forward to)")
		}
	}

	j := c.Auth.JWT
	var sources []string
	for i, v := range []string{j.HS256SecretEnv, j.JWKSURL, j.JWKSFile, j.PublicKeyFile} {
		if v != "" {
			sources = append(sources, jwtSources[i])
		}
	}
	switch {
	case len(sources) == 0:
		d.errf(at("auth", "jwt"), "auth.jwt", "set one key source: %s", strings.Join(jwtSources, ", "))
	case len(sources) > 1:
		for _, s := range sources[1:] {
			d.errf(at("auth", "jwt", s), "auth.jwt."+s, "only one key source may be set (%s is set too)", sources[0])
		}
	}

	if _, ok := c.Tiers[c.DefaultTier]; !ok && len(c.Tiers) > 0 {
		if k, _ := lookup(root, "default_tier"); k != nil {
			d.errf(at("default_tier"), "default_tier", "unknown tier %q (tiers: %s)", c.DefaultTier, strings.Join(sortedKeys(c.Tiers), ", "))
		} else {
			d.errf(at("tiers"), "default_tier", "not set, and there is no tier named %q to default to", DefaultTierName)
		}
	}

	d.checkUpstreamSections(c, root)
	d.checkSharedCounters(c)

	for i, w := range c.Cache.Warm {
		n, p := d.warmAt[i].node, d.warmAt[i].path
		t, ok := c.Tools[w.Tool]
		switch {
		case w.Tool == "":
			d.errf(n, p+".tool", "required")
		case !ok:
			d.errf(n, p+".tool", "unknown tool %q (it must be listed under tools, with a cache)", w.Tool)
		case t.Cache == nil:
			d.errf(n, p+".tool", "tool %q has no cache to warm", w.Tool)
		case w.Tenant == "" && !t.Cache.Shared:
			d.errf(n, p+".tenant", "required: tool %q caches per tenant (its cache is not shared)", w.Tool)
		}
	}
	if d.embedded && len(c.Cache.Warm) > 0 {
		// Warming calls the upstream before serving: a server embedding
		// the engine has none, and its own tools are not called at start.
		d.warnf(at("cache", "warm"), "cache.warm", "ignored by a server embedding the engine (only the gateway warms its cache)")
	}
}

// checkSharedCounters refuses rules that would count on one key with
// different meanings. A tier's rules, the rules of a tool's upstream and
// the tool's rules are evaluated together, so the same name and per in two
// of them is one counter charged twice. Rules per tenant or subject (no
// tool in the key) of different tools or upstreams may share a counter on
// purpose, but only with identical settings. (Tiers are not compared with
// each other: a tenant is in one tier.)
func (d *decoder) checkSharedCounters(c *Config) {
	type key struct {
		name string
		per  keyspace.Per
	}
	inTier := map[key]ruleRef{}
	for _, tier := range sortedKeys(d.tierRules) {
		for _, r := range d.tierRules[tier] {
			if _, ok := inTier[key{r.rule.Name, r.rule.Per}]; !ok {
				inTier[key{r.rule.Name, r.rule.Per}] = ruleRef{r.rule, r.name, r.path}
			}
		}
	}
	// tierClash reports, as a problem, whether r counts on the key of a
	// tier's rule (the two are evaluated together).
	tierClash := func(k key, r ruleRef) bool {
		t, ok := inTier[k]
		if ok {
			d.errf(r.name, r.path, "rule %q per %s is also defined in %s (line %d): the two would share one counter; rename one",
				k.name, k.per, strings.TrimSuffix(t.path, ".name"), t.name.Line)
		}
		return ok
	}
	byKey := map[key]ruleRef{}
	// share claims for r the counter of key k, which the rules of other
	// tools and upstreams may share with identical settings.
	share := func(k key, r ruleRef) {
		if k.per != keyspace.PerTenant && k.per != keyspace.PerSubject {
			return // the key holds the tool: no sharing across tools
		}
		if first, ok := byKey[k]; !ok {
			byKey[k] = r
		} else if !sameRule(first.rule, r.rule) {
			d.errf(r.name, r.path, "rule %q per %s shares a counter with %s (line %d) but has different settings; rules that share a counter must be identical",
				k.name, k.per, strings.TrimSuffix(first.path, ".name"), first.name.Line)
		}
	}
	type toolRule struct {
		tool string
		ruleRef
	}
	inTool := map[key][]toolRule{} // the tools' rules, by key
	for _, tool := range sortedKeys(d.toolRules) {
		for _, r := range d.toolRules[tool] {
			k := key{r.rule.Name, r.rule.Per}
			if !tierClash(k, r) {
				inTool[k] = append(inTool[k], toolRule{tool, r})
				share(k, r)
			}
		}
	}
	for i, u := range d.upstreamAt {
	rules:
		for _, r := range u.rules {
			k := key{r.rule.Name, r.rule.Per}
			if tierClash(k, r) {
				continue
			}
			for _, t := range inTool[k] {
				if c.upstreamIndex(t.tool) == i {
					d.errf(r.name, r.path, "rule %q per %s is also defined in %s (line %d), a tool of this upstream: the two would share one counter; rename one",
						k.name, k.per, strings.TrimSuffix(t.path, ".name"), t.name.Line)
					continue rules
				}
			}
			share(k, r)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
