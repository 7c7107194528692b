package policy

import (
	"errors"
	"testing"
)

// yaml.v3 reports the line of a parser error (as opposed to a scanner
// error) 0-based: syntaxError takes it as it is, so the problem is blamed
// on the line before the one at fault, a valid line of the file (here the
// auth line, for a bad flow list on the tiers line).
func TestSyntaxErrorLineOffByOne(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		line       int
	}{
		{"bad flow list", head + "tiers: {free: {limits: [}}\nlisten: \":1\"\n", 3},
		{"flow map not closed", head + "listen: \":1\"\ntiers: {free: {limits: []}\nstore: {}\n", 4},
	} {
		_, err := Parse("m.yaml", []byte(c.yaml))
		var es Errors
		if !errors.As(err, &es) || len(es) != 1 {
			t.Fatalf("%s: %v", c.name, err)
		}
		if es[0].Line != c.line {
			t.Errorf("%s: reported at line %d, the fault is on line %d: %v", c.name, es[0].Line, c.line, es[0])
		}
	}
}
