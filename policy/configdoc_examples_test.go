package policy

import (
	"fmt"
	"go/ast"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/mcpgate/mcpgate/cache"
)

// The ```yaml blocks of docs/config.md are its examples. These tests keep
// them honest: together they set every field the decoder accepts, each one
// is a valid configuration (alone, or merged into exampleBase), and the
// default column says what Parse gives a field the file leaves out.

// exampleBase is the smallest valid configuration: an upstream and a key
// source. A block that is not a complete configuration is merged into it.
const exampleBase = `
upstream:
  url: http://127.0.0.1:9000/mcp
auth:
  jwt:
    hs256_secret_env: MCPGATE_JWT_SECRET
`

// exampleExclusive are groups of settings a file may set only one of. A
// block (or context) that sets one of a group takes the place of whichever
// the base sets, as a reader replacing that part of the base would do.
var exampleExclusive = [][]string{
	{"upstream.url", "upstreams"},
	{"auth.jwt.hs256_secret_env", "auth.jwt.jwks_url", "auth.jwt.jwks_file", "auth.jwt.public_key_file"},
}

// exampleNeeds are the blocks that are fragments of a larger configuration:
// they refer to something another section's example defines, and are valid
// only with it. Keyed by the heading of their section; the value is merged
// with every block of the section, and the test fails when one of them
// no longer needs it.
var exampleNeeds = map[string]struct{ yaml, why string }{
	"Rules": {
		yaml: "default_tier: pro",
		why:  "its rules are those of a tier pro; a configuration with tiers must have its default tier among them",
	},
	"`cache`": {
		yaml: "tools: {search: {cache: {ttl: 10m}}}",
		why:  "warm fills the cache of the tool search, whose cache the tools example sets",
	},
}

// parseYAMLMap decodes a YAML mapping into plain values.
func parseYAMLMap(text string) (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(text), &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("not a mapping")
	}
	return m, nil
}

// lookupKey returns the value at a dotted path of m (keys only, no lists).
func lookupKey(m map[string]any, path string) (any, bool) {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = mm[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// removeKey deletes the key at a dotted path of m, if present.
func removeKey(m map[string]any, path string) {
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			return
		}
		m = next
	}
	delete(m, keys[len(keys)-1])
}

// deepCopy copies the mappings of v (lists and scalars are not modified
// by mergeYAML and are shared).
func deepCopy(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		out[k] = deepCopy(x)
	}
	return out
}

// mergeYAML returns base with over merged in: mappings are merged key by
// key, anything else in over replaces what base has; see exampleExclusive.
func mergeYAML(base, over map[string]any) map[string]any {
	out := deepCopy(base).(map[string]any)
	for _, group := range exampleExclusive {
		if slices.ContainsFunc(group, func(p string) bool { _, ok := lookupKey(over, p); return ok }) {
			for _, p := range group {
				removeKey(out, p)
			}
		}
	}
	var merge func(dst, src map[string]any)
	merge = func(dst, src map[string]any) {
		for k, v := range src {
			sm, ok1 := v.(map[string]any)
			dm, ok2 := dst[k].(map[string]any)
			if ok1 && ok2 {
				merge(dm, sm)
				continue
			}
			dst[k] = deepCopy(v)
		}
	}
	merge(out, over)
	return out
}

// isCompleteConfig reports whether m is a configuration by itself: it says
// where to forward and how to verify tokens.
func isCompleteConfig(m map[string]any) bool {
	_, url := lookupKey(m, "upstream.url")
	_, ups := m["upstreams"]
	_, auth := m["auth"]
	return auth && (url || ups)
}

// parseMerged parses the configuration made of exampleBase and the given
// YAML mappings, merged in turn.
func parseMerged(name string, parts ...map[string]any) (*Config, error) {
	m, err := parseYAMLMap(exampleBase)
	if err != nil {
		return nil, err
	}
	for _, p := range parts {
		m = mergeYAML(m, p)
	}
	data, err := yaml.Marshal(m)
	if err != nil {
		return nil, err
	}
	return Parse(name, data)
}

// parseExample parses a block of docs/config.md as a configuration: as it
// is when complete, else merged into exampleBase, with the context of
// exampleNeeds when its section has one.
func parseExample(b docBlock, withNeeds bool) (*Config, error) {
	name := "block" // problems say "block:LINE", LINE of the block or of the merged file
	m, err := parseYAMLMap(b.text)
	if err != nil {
		return nil, err
	}
	need, ok := exampleNeeds[b.section]
	if isCompleteConfig(m) && !(withNeeds && ok) {
		return Parse(name, []byte(b.text))
	}
	parts := []map[string]any{m}
	if withNeeds && ok {
		nm, err := parseYAMLMap(need.yaml)
		if err != nil {
			return nil, fmt.Errorf("exampleNeeds[%q]: %v", b.section, err)
		}
		parts = append(parts, nm)
	}
	return parseMerged(name, parts...)
}

// Every example of docs/config.md is a valid configuration, so that an
// example cannot rot as the decoder changes.
func TestConfigDocExamplesParse(t *testing.T) {
	t.Parallel()
	page := configDoc(t)
	if len(page.blocks) == 0 {
		t.Fatal("docs/config.md has no ```yaml blocks")
	}
	used := map[string]bool{}
	for _, b := range page.blocks {
		// Unset ${VAR}s are warnings (Config.Warnings), not problems.
		_, err := parseExample(b, true)
		need, needs := exampleNeeds[b.section]
		if !needs {
			if err != nil {
				t.Errorf("%s:%d: the example of section %q is not a valid configuration (as it is, or merged into a minimal one):\n%v", configDocFile, b.line, b.section, err)
			}
			continue
		}
		used[b.section] = true
		switch _, errAlone := parseExample(b, false); {
		case errAlone == nil:
			t.Errorf("%s:%d: the example of section %q is valid without the context exampleNeeds gives it (%s): remove that entry", configDocFile, b.line, b.section, need.why)
		case err != nil:
			t.Errorf("%s:%d: the example of section %q is not a valid configuration, even with the context of exampleNeeds (%s):\n%v", configDocFile, b.line, b.section, need.why, err)
		}
	}
	for s := range exampleNeeds {
		if !used[s] {
			t.Errorf("exampleNeeds names section %q, which has no example in docs/config.md", s)
		}
	}
}

// schemaSets returns the paths the decoder accepts (fields) and those that
// have fields below them (inner), written as schemaPaths writes them.
func schemaSets() (fields, inner map[string]bool) {
	fields, inner = map[string]bool{}, map[string]bool{}
	for _, p := range schemaPaths() {
		fields[p] = true
		for i := range len(p) {
			if p[i] == '.' || p[i] == '[' {
				inner[p[:i]] = true
			}
			if strings.HasSuffix(p[:i+1], "[]") && i+1 < len(p) {
				inner[p[:i+1]] = true
			}
		}
	}
	return fields, inner
}

// joinKey appends a key to a path written as schemaPaths writes them.
func joinKey(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

// examplePaths adds to out the decoder paths (as schemaPaths writes them)
// that n, the value at path at, sets. A key the schema does not name at a
// place where names are chosen by the file (tiers, tools) stands for
// <name>; list elements are []. Values of fields with nothing below them in
// the schema (headers, env, args) are not looked into.
func examplePaths(n *yaml.Node, at string, fields, inner, out map[string]bool) {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	if n == nil {
		return
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			examplePaths(c, at, fields, inner, out)
		}
	case yaml.SequenceNode:
		if inner[at+"[]"] {
			for _, c := range n.Content {
				examplePaths(c, at+"[]", fields, inner, out)
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" { // <<: *anchor, or a list of them
				if v.Kind == yaml.SequenceNode {
					for _, c := range v.Content {
						examplePaths(c, at, fields, inner, out)
					}
				} else {
					examplePaths(v, at, fields, inner, out)
				}
				continue
			}
			p := joinKey(at, k.Value)
			if !fields[p] && !inner[p] {
				p = joinKey(at, "<name>")
			}
			if fields[p] {
				out[p] = true
			}
			if inner[p] {
				examplePaths(v, p, fields, inner, out)
			}
		}
	}
}

// Every field the decoder accepts is set in some example of docs/config.md
// (a rule's fields in any list of rules).
func TestConfigDocExamplesSetEveryField(t *testing.T) {
	t.Parallel()
	page := configDoc(t)
	fields, inner := schemaSets()
	set := map[string]bool{}
	for _, b := range page.blocks {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(b.text), &doc); err != nil {
			t.Errorf("%s:%d: not YAML: %v", configDocFile, b.line, err)
			continue
		}
		found := map[string]bool{}
		examplePaths(&doc, "", fields, inner, found)
		for p := range found {
			set[docPath(p)] = true
		}
	}
	for _, p := range schemaPaths() {
		if !set[docPath(p)] {
			t.Errorf("no ```yaml example in docs/config.md sets %s: add it to the example of its section", docPath(p))
		}
	}
}

// defaultContexts are what a configuration needs for a field below a list
// or a named entry to exist: the row of a field under a prefix is checked
// on exampleBase merged with the context of the longest prefix that
// matches. A rule's fields are checked in the global list.
var defaultContexts = map[string]string{
	"upstreams[].":        "upstreams: [{name: docs, url: http://127.0.0.1:9001/mcp}]",
	"tiers.<name>.":       "tiers: {free: {}}",
	"global[].":           "global: [{name: docs, algorithm: fixed_window, limit: 10, period: 1m}]",
	"tools.<name>.":       "tools: {docs: {}}",
	"tools.<name>.cost.":  "tools: {docs: {cost: {from_result: _meta.usage.tokens}}}",
	"tools.<name>.cache.": "tools: {docs: {cache: {ttl: 1m}}}",
	"cache.warm[].":       "tools: {docs: {cache: {ttl: 1m, shared: true}}}\ncache: {warm: [{tool: docs}]}",
}

// defaultsElsewhere are fields Parse leaves zero, for another package to
// apply its own default: the row must give that package's default.
var defaultsElsewhere = map[string]any{
	"cache.max_entries": cache.DefaultMaxEntries,      // cache.NewMemoryStore applies it
	"cache.max_bytes":   int64(cache.DefaultMaxBytes), // cache.NewMemoryStore applies it
}

// defaultNotCompared are the rows whose default is written as a value in
// backquotes but is not the value Parse gives the field, each with why.
// Rows whose default is prose (none, required, derived ...) are not
// compared either; every other row is.
var defaultNotCompared = map[string]string{
	"upstreams[].prefix":             "<name>__ is a pattern: the upstream's own name followed by __",
	"store.redis":                    `"" stands for no Redis (the in-process store), kept as a nil list of addresses`,
	"cache.redis":                    `"" stands for no Redis of its own (store.redis is used), kept as a nil list of addresses`,
	"tiers.<name>.deny_as":           `Parse leaves "", which Config.DenyAs answers as http`,
	"tools.<name>.on_error":          `Parse leaves "", which Config.ToolOnError answers with store.on_error`,
	"tools.<name>.cost":              "the scalar form is Cost.Fixed of a struct; a tool without cost has Cost{Fixed: 1}",
	"<rule>.per":                     "one default per kind of list (global, tiers and upstreams, tools)",
	"<rule>.burst":                   "names the rule's own limit; Parse leaves 0 and the limiter uses limit",
	"<rule>.methods":                 "Parse leaves nil, which Rule.Applies reads as tools/call only",
	"server.max_requests_per_tenant": "a formula of server.max_connections",
}

// leadingLiteral is a default cell that begins with a value in backquotes.
var leadingLiteral = regexp.MustCompile("^`([^`]*)`")

// decoderPath is the decoder path at which the default of row p is read.
func decoderPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "<rule>."); ok {
		return "global[]." + rest
	}
	return p
}

// valueAt reads the field at decoder path p of c by reflection: a key is
// the struct field of the same name without underscores (case aside), a
// <name> the only entry of a map, [] the only element of a list. Fields of
// embedded structs count (a rule's limit.Rule).
func valueAt(c *Config, p string) (reflect.Value, error) {
	v := reflect.ValueOf(c).Elem()
	for _, seg := range strings.Split(strings.ReplaceAll(p, "[]", ".[]"), ".") {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return v, fmt.Errorf("%s: nil before %s", p, seg)
			}
			v = v.Elem()
		}
		switch {
		case seg == "[]":
			if v.Kind() != reflect.Slice || v.Len() != 1 {
				return v, fmt.Errorf("%s: want a list of one element, got %s", p, v.Type())
			}
			v = v.Index(0)
		case seg == "<name>":
			if v.Kind() != reflect.Map || v.Len() != 1 {
				return v, fmt.Errorf("%s: want a map of one entry, got %s", p, v.Type())
			}
			v = v.MapIndex(v.MapKeys()[0])
		default:
			if v.Kind() != reflect.Struct {
				return v, fmt.Errorf("%s: %s is not a struct field of %s", p, seg, v.Type())
			}
			want := strings.ReplaceAll(seg, "_", "")
			f := v.FieldByNameFunc(func(name string) bool { return ast.IsExported(name) && strings.EqualFold(name, want) })
			if !f.IsValid() {
				return v, fmt.Errorf("%s: %s has no field %s", p, v.Type(), seg)
			}
			v = f
		}
	}
	return v, nil
}

// literalValue converts the default written in the doc to the type of the
// field: as YAML would decode it (durations in Go syntax), percentages as
// the fraction Parse makes of them.
func literalValue(lit string, typ reflect.Type) (any, error) {
	if typ.Kind() == reflect.Float64 {
		if m := percentRE.FindStringSubmatch(strings.Trim(lit, `"`)); m != nil {
			f, err := strconv.ParseFloat(m[1], 64)
			return f / 100, err
		}
	}
	ptr := reflect.New(typ)
	if err := yaml.Unmarshal([]byte(lit), ptr.Interface()); err != nil {
		return nil, err
	}
	return ptr.Elem().Interface(), nil
}

// showValue writes v as a default is written: strings quoted, durations
// in Go syntax.
func showValue(v reflect.Value) string {
	if v.Kind() == reflect.String {
		return strconv.Quote(v.String())
	}
	return fmt.Sprint(v.Interface())
}

// The default column of docs/config.md gives, for every field whose default
// is a value in backquotes, what Parse produces when the file leaves the
// field out. A default naming another field by its path (`upstream.timeout`)
// must equal that field's value.
func TestConfigDocDefaults(t *testing.T) {
	t.Parallel()
	page := configDoc(t)
	fields, inner := schemaSets()
	accepted := map[string]bool{}
	for p := range fields {
		accepted[docPath(p)] = true
	}
	for p := range defaultNotCompared {
		if r, ok := page.rows[p]; !ok || !leadingLiteral.MatchString(r.def) {
			t.Errorf("defaultNotCompared names %s, which has no row with a default in backquotes", p)
		}
	}
	for p := range defaultsElsewhere {
		if _, ok := page.rows[p]; !ok {
			t.Errorf("defaultsElsewhere names %s, which has no row", p)
		}
	}
	compared := 0
	for _, p := range slices.Sorted(maps.Keys(page.rows)) {
		r := page.rows[p]
		m := leadingLiteral.FindStringSubmatch(r.def)
		if m == nil || defaultNotCompared[p] != "" || !accepted[p] {
			continue // prose, explained above, or a stale row (TestConfigDocCoversEveryField)
		}
		lit, dp := m[1], decoderPath(p)
		prefix := ""
		for pre := range defaultContexts {
			if strings.HasPrefix(dp, pre) && len(pre) > len(prefix) {
				prefix = pre
			}
		}
		ctx := map[string]any{}
		if s := defaultContexts[prefix]; s != "" {
			var err error
			if ctx, err = parseYAMLMap(s); err != nil {
				t.Fatalf("defaultContexts[%q]: %v", prefix, err)
			}
		}
		// The field must be left out of the configuration checked.
		base, _ := parseYAMLMap(exampleBase)
		text, _ := yaml.Marshal(mergeYAML(base, ctx))
		var doc yaml.Node
		if err := yaml.Unmarshal(text, &doc); err != nil {
			t.Fatal(err)
		}
		set := map[string]bool{}
		examplePaths(&doc, "", fields, inner, set)
		if set[dp] {
			t.Errorf("%s: the configuration that checks its default sets it (defaultContexts[%q])", p, prefix)
			continue
		}
		c, err := parseMerged("defaults", ctx)
		if err != nil {
			t.Errorf("%s: the configuration that checks its default is not valid (defaultContexts[%q]): %v", p, prefix, err)
			continue
		}
		got, err := valueAt(c, dp)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		var want any
		switch ref, elsewhere := strings.TrimSpace(lit), defaultsElsewhere[p]; {
		case elsewhere != nil:
			want = elsewhere
			if !got.IsZero() {
				t.Errorf("%s: Parse now gives it %s: remove it from defaultsElsewhere", p, showValue(got))
			}
			if lv, err := literalValue(lit, got.Type()); err != nil || !reflect.DeepEqual(lv, want) {
				t.Errorf("%s:%d: %s: the default column says `%s`, the default applied is %v", configDocFile, r.line, p, lit, want)
			}
			compared++
			continue
		case strings.Contains(ref, ".") && accepted[ref] && ref != p:
			rv, err := valueAt(c, decoderPath(ref))
			if err != nil {
				t.Errorf("%s: default %s: %v", p, ref, err)
				continue
			}
			want = rv.Interface()
		default:
			if want, err = literalValue(lit, got.Type()); err != nil {
				t.Errorf("%s:%d: %s: cannot read the default `%s` as a %s (%v); correct it, or add the row to defaultNotCompared with the reason", configDocFile, r.line, p, lit, got.Type(), err)
				continue
			}
		}
		if !reflect.DeepEqual(got.Interface(), want) {
			t.Errorf("%s:%d: %s: the default column says `%s`, Parse gives %s", configDocFile, r.line, p, lit, showValue(got))
		}
		compared++
	}
	if compared == 0 {
		t.Error("no default was compared: is the default column still the third?")
	}
	t.Logf("%d defaults compared", compared)
}
