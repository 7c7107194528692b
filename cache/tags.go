package cache

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// ErrInvalidTemplate means a tag template does not parse: an unclosed
// "{{", an empty path segment, or a placeholder that is not args or
// args.<path>.
var ErrInvalidTemplate = errors.New("cache: invalid tag template")

// Tags is a compiled list of tag templates such as "product:{{args.id}}".
// Literal text is kept as is; each {{args.a.b}} placeholder is replaced by
// the value at that path of the call's arguments (a segment of digits
// indexes an array); {{args}} is the whole arguments. Spaces inside the
// braces are ignored. A *Tags is immutable and safe for concurrent use.
//
// A value renders as: a string, its text (unquoted); null or a missing path,
// the empty string; a number, its canonical form (1.0 and 1 agree); true,
// false, objects and arrays, their canonical JSON. The same call therefore
// renders the same tags wherever it is rendered: on the cached tool (tags)
// and on the mutating tool (invalidates).
type Tags struct {
	templates [][]tagPart
}

type tagPart struct {
	lit  string
	path []string // nil: a literal; empty: the whole arguments
	ph   bool
}

// CompileTags parses templates; an error wraps ErrInvalidTemplate and names
// the template.
func CompileTags(templates []string) (*Tags, error) {
	t := &Tags{templates: make([][]tagPart, len(templates))}
	for i, s := range templates {
		parts, err := parseTemplate(s)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %s", ErrInvalidTemplate, s, err)
		}
		t.templates[i] = parts
	}
	return t, nil
}

func parseTemplate(s string) ([]tagPart, error) {
	var parts []tagPart
	for s != "" {
		i := strings.Index(s, "{{")
		if i < 0 {
			parts = append(parts, tagPart{lit: s})
			break
		}
		if i > 0 {
			parts = append(parts, tagPart{lit: s[:i]})
		}
		s = s[i+2:]
		j := strings.Index(s, "}}")
		if j < 0 {
			return nil, errors.New(`unclosed "{{"`)
		}
		expr := strings.TrimSpace(s[:j])
		s = s[j+2:]
		segs := strings.Split(expr, ".")
		if segs[0] != "args" {
			return nil, fmt.Errorf("placeholder %q: want args or args.<path>", expr)
		}
		for _, seg := range segs[1:] {
			if seg == "" {
				return nil, fmt.Errorf("placeholder %q: empty path segment", expr)
			}
		}
		parts = append(parts, tagPart{path: segs[1:], ph: true})
	}
	return parts, nil
}

// Render returns the tags of a call with arguments args, one per template,
// in order. It fails with ErrInvalidArguments when args has no canonical
// form.
func (t *Tags) Render(args json.RawMessage) ([]string, error) {
	if t == nil || len(t.templates) == 0 {
		return nil, nil
	}
	var root any
	decoded := false
	out := make([]string, len(t.templates))
	var b strings.Builder
	for i, parts := range t.templates {
		b.Reset()
		for _, p := range parts {
			if !p.ph {
				b.WriteString(p.lit)
				continue
			}
			if !decoded {
				canon, err := jsonscan.Canonical(args)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", ErrInvalidArguments, err)
				}
				d := json.NewDecoder(bytes.NewReader(canon))
				d.UseNumber()
				if err := d.Decode(&root); err != nil {
					return nil, fmt.Errorf("%w: %w", ErrInvalidArguments, err)
				}
				decoded = true
			}
			s, err := renderValue(lookup(root, p.path))
			if err != nil {
				return nil, err
			}
			b.WriteString(s)
		}
		out[i] = b.String()
	}
	return out, nil
}

// RenderTags compiles templates and renders them for args: CompileTags then
// Render. Compile once with CompileTags when rendering often.
func RenderTags(templates []string, args json.RawMessage) ([]string, error) {
	t, err := CompileTags(templates)
	if err != nil {
		return nil, err
	}
	return t.Render(args)
}

func lookup(v any, path []string) any {
	for _, seg := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[seg]
		case []any:
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || n >= len(x) || strconv.Itoa(n) != seg {
				return nil
			}
			v = x[n]
		default:
			return nil
		}
	}
	return v
}

func renderValue(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil // canonical already: decoded from canonical JSON
	default:
		raw, err := json.Marshal(x)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalidArguments, err)
		}
		canon, err := jsonscan.Canonical(raw)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalidArguments, err)
		}
		return string(canon), nil
	}
}
