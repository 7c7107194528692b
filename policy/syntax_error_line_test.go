package policy

import (
	"errors"
	"testing"
)

// Every kind of yaml.v3 syntax error is blamed on the line at fault:
// parser errors (whose line yaml.v3 prints 0-based) and scanner errors
// (printed 1-based) alike, and a problem found at the end of the input on
// the last line, never past it, whatever the line breaks.
func TestSyntaxErrorLines(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml string
		line       int
	}{
		{"parser: expected key", head + "tiers: {}\n- x\n", 4},
		// The line at fault, not the valid line before it.
		{"parser: bad flow list", head + "tiers: {free: {limits: [}}\nlisten: \":1\"\n", 3},
		{"parser: flow map not closed", head + "listen: \":1\"\ntiers: {free: {limits: []}\nstore: {}\n", 4},
		{"parser: undefined tag handle", head + "listen: !x!y a\n", 3},
		// yaml.v3 blames the start of the sequence being parsed.
		{"parser: expected '-' indicator", head + "global:\n  - {name: a}\n  b: 1\n", 4},
		{"parser at end of input", head + "tiers: [1,\n", 3},
		{"parser at end, blank lines after", head + "tiers: [1,\n\n\n", 5},
		{"parser at end, no final break", head + "tiers: [1,", 3},
		{"parser at end, CRLF", "listen: \":1\"\r\ntiers: [1,\r\n", 2},
		{"parser on the first line", "tiers: [}\n", 1},
		{"scanner: bad token", head + "listen: @x\n", 3},
		{"scanner: unclosed quote", head + "listen: \"abc\n", 3},
		{"scanner: indentation", head + "listen: a\n tiers: {}\n", 4},
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
