package policy

import (
	"sort"
	"strings"
)

// schemaName is the name probe documents give a tier or tool (any key of a
// mapping whose keys the file chooses); schemaPaths shows it as <name>.
const schemaName = "NAME"

// schemaProbes are the values schemaPaths puts at a key to reach what lies
// below it: a mapping, a list of mappings, a mapping of named mappings
// (tiers, tools) and a mapping of named lists.
var schemaProbes = []string{"{}", "[{}]", "{" + schemaName + ": {}}", "{" + schemaName + ": [{}]}"}

// maxSchemaPaths stops schemaPaths should the schema ever become recursive.
const maxSchemaPaths = 10000

// schemaPaths returns every key path the decoder accepts, sorted, with
// names the file chooses written <name> and list elements written []:
// "tiers.<name>.limits[].algorithm". It is derived from the decoder itself
// (every fields map object is given reports its keys), not from a list
// kept by hand: starting from an empty document, each accepted key is set
// in turn to each of schemaProbes, and whatever keys the decoder then
// offers below it are explored the same way. A section the decoder reaches
// only when another field has a particular value would be missed; none
// does today.
func schemaPaths() []string {
	found := map[string]bool{}
	var queue []string
	visit := func(doc string) {
		d := &decoder{file: "schema", tierRules: map[string][]ruleRef{}, toolRules: map[string][]ruleRef{}}
		d.offered = func(p string) {
			if !found[p] && len(found) < maxSchemaPaths {
				found[p] = true
				queue = append(queue, p)
			}
		}
		if root := d.document([]byte(doc)); root != nil {
			d.config(root, &Config{})
		}
	}
	visit("{}")
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, v := range schemaProbes {
			visit(nestAt(p, v))
		}
	}
	out := make([]string, 0, len(found))
	for p := range found {
		out = append(out, displayPath(p))
	}
	sort.Strings(out)
	return out
}

// pathSegments splits a path built by join and index ("a.b[0].c") into
// keys and "[0]"s.
func pathSegments(p string) []string {
	var out []string
	for _, part := range strings.Split(p, ".") {
		key, rest, _ := strings.Cut(part, "[")
		out = append(out, key)
		if rest != "" {
			for _, ix := range strings.Split(strings.TrimSuffix(rest, "]"), "][") {
				out = append(out, "["+ix+"]")
			}
		}
	}
	return out
}

// nestAt returns a flow-style YAML document holding value v at path p.
func nestAt(p, v string) string {
	segs := pathSegments(p)
	for i := len(segs) - 1; i >= 0; i-- {
		if strings.HasPrefix(segs[i], "[") {
			v = "[" + v + "]"
		} else {
			v = "{" + segs[i] + ": " + v + "}"
		}
	}
	return v
}

// displayPath writes schemaName as <name> and list indexes as [].
func displayPath(p string) string {
	segs := pathSegments(p)
	var b strings.Builder
	for i, s := range segs {
		switch {
		case strings.HasPrefix(s, "["):
			b.WriteString("[]")
			continue
		case i > 0:
			b.WriteByte('.')
		}
		if s == schemaName {
			s = "<name>"
		}
		b.WriteString(s)
	}
	return b.String()
}
