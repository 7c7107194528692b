package policy

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// maxVisits bounds the nodes one Parse walks. Aliases let a small file name
// the same subtree many times; the bound keeps a hostile or broken file from
// costing more than a moment (a real configuration visits a few hundred).
const maxVisits = 1 << 20

// decoder walks a yaml.Node tree against the configuration schema,
// collecting every problem rather than stopping at the first.
type decoder struct {
	file   string
	errs   []*Error
	warns  []*Error
	visits int
	over   bool // maxVisits reached: stop walking

	// Positions kept for the checks that span sections.
	tierRules map[string][]ruleRef
	toolRules map[string][]ruleRef
	lastRules []ruleRef // of the latest rules call
	warmAt    []warmRef // one per Cache.Warm entry

	upstreamAt        []upstreamRef // one per Config.Upstreams entry
	upstreamsGiven    bool          // upstreams: is a non-empty list
	upstreamURLAt     *yaml.Node    // upstream.url, when given
	upstreamHeadersAt *fieldRef     // upstream.headers, when not empty
	toolTimeoutAt     []fieldRef    // every tools.<name>.timeout given
	toolAt            []toolRef     // every tools.<name> key, in file order

	expirySet, leewaySet bool // auth.jwt.require_expiry / leeway given (their defaults are not zero)
	embedded             bool // ParseEmbedded: upstream is optional

	// offered, when set, is told the path of every key each mapping it
	// decodes accepts, present or not (see schemaPaths).
	offered func(path string)
}

type warmRef struct {
	node *yaml.Node
	path string
}

func (d *decoder) problem(n *yaml.Node, path, format string, args ...any) *Error {
	line, col := 1, math.MaxInt // problems without a node come last on line 1
	if n != nil && n.Line > 0 {
		line, col = n.Line, n.Column
	}
	return &Error{File: d.file, Line: line, Field: path, Msg: fmt.Sprintf(format, args...), col: col}
}

// maxErrors bounds the problems one Parse reports; past it, decoding stops.
const maxErrors = 1000

// errf records a problem at n's line.
func (d *decoder) errf(n *yaml.Node, path, format string, args ...any) {
	if len(d.errs) >= maxErrors {
		if !d.over {
			d.over = true
			d.errs = append(d.errs, d.problem(n, "", "too many problems; stopped here"))
		}
		return
	}
	d.errs = append(d.errs, d.problem(n, path, format, args...))
}

// hasErr reports whether a problem was already recorded for path.
func (d *decoder) hasErr(path string) bool {
	for _, e := range d.errs {
		if e.Field == path {
			return true
		}
	}
	return false
}

// warnf records a non-fatal problem at n's line.
func (d *decoder) warnf(n *yaml.Node, path, format string, args ...any) {
	d.warns = append(d.warns, d.problem(n, path, format, args...))
}

// deref follows aliases and counts the visit. It returns nil for a missing
// node and, once the visit budget is spent, for every node.
func (d *decoder) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 100 { // the parser never builds an alias chain; be safe anyway
			return nil
		}
		n = n.Alias
	}
	if n == nil || d.over {
		return nil
	}
	d.visits++
	if d.visits > maxVisits {
		d.over = true
		d.errf(n, "", "document too large: more than %d nodes (after expanding aliases)", maxVisits)
		return nil
	}
	return n
}

// isNull reports whether n is absent or an explicit null (`key:`, `~`,
// `null`): such a field keeps its default.
func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names what n is, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		switch n.Tag {
		case "!!str":
			return fmt.Sprintf("the string %q", v)
		case "!!int":
			return "the integer " + v
		case "!!float":
			return "the number " + v
		case "!!bool":
			return "the boolean " + v
		case "!!null":
			return "null"
		}
		return fmt.Sprintf("%s %q", n.Tag, v)
	}
	return "an unexpected node"
}

// join appends a mapping key to a field path. Keys that could be misread as
// path syntax are quoted.
func join(path, key string) string {
	if !plainKey.MatchString(key) {
		key = strconv.Quote(key)
		if path == "" {
			return "[" + key + "]"
		}
		return path + "[" + key + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

var (
	plainKey = regexp.MustCompile(`^[A-Za-z0-9_\-]+$`)
	bigInt   = regexp.MustCompile(`^[-+]?[0-9_]+$`) // resolved as a float by yaml.v3 when too large for int64
)

func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

// pair is one key of a mapping, merge keys (`<<: *anchor`) expanded.
type pair struct {
	key  *yaml.Node
	name string
	val  *yaml.Node
}

// pairs returns n's entries in order, reporting non-scalar and duplicate keys.
// Entries brought in by merge keys come after the explicit ones and never
// override them, as YAML specifies.
func (d *decoder) pairs(n *yaml.Node, path string) []pair {
	var out, merged []pair
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.deref(n.Content[i]), n.Content[i+1]
		if k == nil {
			return out
		}
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			merged = append(merged, d.merge(v, path, 0)...)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errf(k, path, "keys must be strings, got %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.errf(k, join(path, k.Value), "duplicate key (first at line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		out = append(out, pair{k, k.Value, v})
	}
	for _, p := range merged {
		if seen[p.name] == nil {
			seen[p.name] = p.key
			out = append(out, p)
		}
	}
	return out
}

// merge expands the value of a merge key: a mapping or a list of mappings,
// earlier ones taking precedence.
func (d *decoder) merge(v *yaml.Node, path string, depth int) []pair {
	v = d.deref(v)
	if v == nil {
		return nil
	}
	if depth > 10 {
		d.errf(v, path, "merge keys nested too deeply")
		return nil
	}
	switch v.Kind {
	case yaml.MappingNode:
		return d.pairs(v, path)
	case yaml.SequenceNode:
		var out []pair
		seen := map[string]bool{}
		for _, m := range v.Content {
			if mm := d.deref(m); mm != nil && mm.Kind != yaml.MappingNode {
				d.errf(mm, path, "merge key (<<) wants a mapping or a list of mappings, got %s", describe(mm))
				continue
			}
			for _, p := range d.merge(m, path, depth+1) {
				if !seen[p.name] {
					seen[p.name] = true
					out = append(out, p)
				}
			}
		}
		return out
	}
	d.errf(v, path, "merge key (<<) wants a mapping or a list of mappings, got %s", describe(v))
	return nil
}

// mapping returns n's entries, or reports that n is not a mapping. A null
// value is an empty mapping.
func (d *decoder) mapping(n *yaml.Node, path string) ([]pair, bool) {
	n = d.deref(n)
	if n == nil || isNull(n) {
		return nil, n != nil
	}
	if n.Kind != yaml.MappingNode {
		d.errf(n, path, "want a mapping, got %s", describe(n))
		return nil, false
	}
	return d.pairs(n, path), true
}

// fields maps the known keys of a mapping to the functions that decode
// their values.
type fields map[string]func(v *yaml.Node, path string)

// object decodes mapping n with f; unknown keys are errors at their line.
// Null values are skipped, so every field keeps its default.
func (d *decoder) object(n *yaml.Node, path string, f fields) {
	if d.offered != nil {
		for k := range f {
			d.offered(join(path, k))
		}
	}
	ps, _ := d.mapping(n, path)
	var names []string
	for _, p := range ps {
		fn, ok := f[p.name]
		if !ok {
			if names == nil {
				for k := range f {
					names = append(names, k)
				}
				sort.Strings(names)
			}
			if s := suggest(p.name, names); s != "" {
				d.errf(p.key, join(path, p.name), "unknown field (did you mean %q?)", s)
			} else {
				d.errf(p.key, join(path, p.name), "unknown field (want one of %s)", strings.Join(names, ", "))
			}
			continue
		}
		if v := d.deref(p.val); v != nil && !isNull(v) {
			fn(v, join(path, p.name))
		}
	}
}

// list calls fn for each element of sequence n (null is an empty list).
func (d *decoder) list(n *yaml.Node, path string, fn func(i int, v *yaml.Node, path string)) {
	n = d.deref(n)
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.errf(n, path, "want a list, got %s", describe(n))
		return
	}
	for i, e := range n.Content {
		if e = d.deref(e); e == nil {
			return
		}
		fn(i, e, index(path, i))
	}
}

// scalar reports whether n is a scalar, recording an error otherwise.
func (d *decoder) scalar(n *yaml.Node, path, want string) bool {
	if n.Kind != yaml.ScalarNode {
		d.errf(n, path, "want %s, got %s", want, describe(n))
		return false
	}
	return true
}

// str decodes a string. Numbers are taken as written (a tenant may be
// called 42); booleans are refused as they are almost always a mistake.
func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if !d.scalar(n, path, "a string") {
		return "", false
	}
	if n.Tag == "!!bool" {
		d.errf(n, path, "want a string, got %s (quote it if you mean the text)", describe(n))
		return "", false
	}
	return n.Value, true
}

// int64 decodes an integer, refusing quoted numbers and floats.
func (d *decoder) int64(n *yaml.Node, path string) (int64, bool) {
	if !d.scalar(n, path, "an integer") {
		return 0, false
	}
	big := n.Tag == "!!float" && bigInt.MatchString(n.Value)
	if (n.Tag == "!!int" || big) && !d.decimal(n, path) {
		return 0, false
	}
	if big {
		d.errf(n, path, "integer %s is out of range", n.Value)
		return 0, false
	}
	if n.Tag != "!!int" {
		d.errf(n, path, "want an integer, got %s", describe(n))
		return 0, false
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			d.errf(n, path, "integer %s is out of range", n.Value)
		} else {
			d.errf(n, path, "want an integer, got %q", n.Value)
		}
		return 0, false
	}
	return v, true
}

var (
	// leadingZero is a decimal-looking integer with a leading zero.
	leadingZero = regexp.MustCompile(`^[-+]?0[0-9_]+$`)
	// radixInt is an integer in hexadecimal, octal or binary notation.
	radixInt = regexp.MustCompile(`^[-+]?0[xXoObB][0-9A-Fa-f_]*$`)
)

// decimal reports whether integer n is free of a leading zero and of a
// 0x, 0o or 0b prefix, reporting it otherwise (other text is left to the
// caller). yaml.v3 reads 010 as octal 8 (YAML 1.1), where YAML 1.2 and
// most readers of the file see 10 (and it takes 08 for a float), and it
// also takes 0x, 0o and 0b integers: a limit or a quota would then
// enforce something other than what the operator reads, so only decimal
// is accepted, as docs/config.md says.
func (d *decoder) decimal(n *yaml.Node, path string) bool {
	s := strings.TrimSpace(n.Value)
	switch {
	case leadingZero.MatchString(s):
		d.errf(n, path, "integer %s has a leading zero, which some YAML readers take for octal and others for decimal: write it without the zero", n.Value)
	case radixInt.MatchString(s):
		d.errf(n, path, "integer %s is not decimal: write it in decimal digits", n.Value)
	default:
		return true
	}
	return false
}

// count decodes a non-negative integer.
func (d *decoder) count(n *yaml.Node, path string) (int64, bool) {
	v, ok := d.int64(n, path)
	if ok && v < 0 {
		d.errf(n, path, "must not be negative, got %d", v)
		return 0, false
	}
	return v, ok
}

// smallCount decodes a non-negative integer that fits an int on every
// platform.
func (d *decoder) smallCount(n *yaml.Node, path string) (int, bool) {
	v, ok := d.count(n, path)
	if ok && v > math.MaxInt32 {
		d.errf(n, path, "must be at most %d, got %d", math.MaxInt32, v)
		return 0, false
	}
	return int(v), ok
}

// positiveInt64 is int64 that must also be at least 1.
func (d *decoder) positiveInt64(n *yaml.Node, path string) (int64, bool) {
	v, ok := d.int64(n, path)
	if ok && v < 1 {
		d.errf(n, path, "must be at least 1, got %d", v)
		return 0, false
	}
	return v, ok
}

// positiveSmallCount is smallCount that must also be at least 1.
func (d *decoder) positiveSmallCount(n *yaml.Node, path string) (int, bool) {
	v, ok := d.smallCount(n, path)
	if ok && v < 1 {
		d.errf(n, path, "must be at least 1, got %d", v)
		return 0, false
	}
	return v, ok
}

func (d *decoder) bool(n *yaml.Node, path string) (bool, bool) {
	if !d.scalar(n, path, "true or false") {
		return false, false
	}
	if n.Tag != "!!bool" {
		d.errf(n, path, "want true or false, got %s", describe(n))
		return false, false
	}
	v, err := strconv.ParseBool(n.Value)
	if err != nil {
		d.errf(n, path, "want true or false, got %q", n.Value)
		return false, false
	}
	return v, true
}

// duration decodes a non-negative Go duration ("25ms", "1m", "720h").
func (d *decoder) duration(n *yaml.Node, path string) (time.Duration, bool) {
	if !d.scalar(n, path, "a duration") {
		return 0, false
	}
	s := strings.TrimSpace(n.Value)
	if n.Tag == "!!int" && s != "0" {
		d.errf(n, path, "bad duration %s: a unit is required (e.g. %q)", s, s+"s")
		return 0, false
	}
	if n.Tag != "!!str" && n.Tag != "!!int" {
		d.errf(n, path, "want a duration like 25ms, 1s, 1m or 720h, got %s", describe(n))
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		hint := "want Go syntax: 25ms, 1s, 1m, 720h"
		if strings.HasSuffix(s, "d") {
			hint = `Go durations have no "d" unit: write 24h for a day`
		}
		d.errf(n, path, "bad duration %q (%s)", n.Value, hint)
		return 0, false
	}
	if v < 0 {
		d.errf(n, path, "must not be negative, got %v", v)
		return 0, false
	}
	return v, true
}

// positiveDuration is duration that must also be above zero.
func (d *decoder) positiveDuration(n *yaml.Node, path string) (time.Duration, bool) {
	v, ok := d.duration(n, path)
	if ok && v == 0 {
		d.errf(n, path, "must be positive")
		return 0, false
	}
	return v, ok
}

var percentRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*%$`)

// percent decodes "10%" to 0.10. Bare numbers are refused: 0.1 could mean a
// tenth or a tenth of a percent.
func (d *decoder) percent(n *yaml.Node, path string) (float64, bool) {
	if !d.scalar(n, path, `a percentage like "10%"`) {
		return 0, false
	}
	m := percentRE.FindStringSubmatch(strings.TrimSpace(n.Value))
	if n.Tag != "!!str" || m == nil {
		d.errf(n, path, `bad percentage: want a string like "10%%", got %s`, describe(n))
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil || v > 100 {
		d.errf(n, path, "bad percentage %q: must be between 0%% and 100%%", n.Value)
		return 0, false
	}
	return v / 100, true
}

// maxArgNodes bounds one warm entry's arguments.
const maxArgNodes = 10000

// value converts n to plain Go values as encoding/json would produce them
// for the same JSON (map[string]any, []any, string, float64/int64, bool,
// nil), so cache keys built from warm arguments match live calls.
func (d *decoder) value(n *yaml.Node, path string, budget *int) (any, bool) {
	if n = d.deref(n); n == nil {
		return nil, false
	}
	if *budget--; *budget < 0 {
		if *budget == -1 {
			d.errf(n, path, "too large (more than %d values)", maxArgNodes)
		}
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := map[string]any{}
		for _, p := range d.pairs(n, path) {
			v, ok := d.value(p.val, join(path, p.name), budget)
			if !ok {
				return nil, false
			}
			m[p.name] = v
		}
		return m, true
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for i, e := range n.Content {
			v, ok := d.value(e, index(path, i), budget)
			if !ok {
				return nil, false
			}
			s = append(s, v)
		}
		return s, true
	}
	switch n.Tag {
	case "!!null":
		return nil, true
	case "!!bool":
		return d.bool(n, path)
	case "!!int":
		return d.int64(n, path)
	case "!!float":
		if leadingZero.MatchString(n.Value) && !d.decimal(n, path) { // 08: as 010 is refused
			return nil, false
		}
		v, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
			d.errf(n, path, "want a finite number, got %q", n.Value)
			return nil, false
		}
		return v, true
	}
	return n.Value, true // strings, timestamps and custom tags: as written
}
