package policy

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrInvalidConfig means a configuration file was read but is not valid.
// Every error Parse and Load return for a bad file (an Errors value) matches
// it with errors.Is; I/O errors from Load do not.
var ErrInvalidConfig = errors.New("policy: invalid configuration")

// Error is one problem in a configuration file. It prints as
//
//	file:line: field.path: problem
//
// or, when the problem is not about one field (a YAML syntax error),
//
//	file:line: problem
type Error struct {
	File  string // the name given to Parse (the path given to Load)
	Line  int    // 1-based; always at least 1
	Field string // dotted path, e.g. "tiers.free.limits[1].algorithm"; may be empty
	Msg   string

	col int // orders problems found on one line
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// Is reports whether target is ErrInvalidConfig.
func (e *Error) Is(target error) bool { return target == ErrInvalidConfig }

// Errors is every problem found in one file, sorted by line. Parse never
// returns an empty Errors.
type Errors []*Error

// Error prints one problem per line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Is reports whether target is ErrInvalidConfig.
func (es Errors) Is(target error) bool { return target == ErrInvalidConfig }

// Unwrap exposes each problem to errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// sortProblems orders by line, then column, keeping the order of discovery
// otherwise, and drops exact repeats (an aliased node is visited once per
// reference and would report the same problem each time).
func sortProblems(es []*Error) []*Error {
	sort.SliceStable(es, func(i, j int) bool {
		if es[i].Line != es[j].Line {
			return es[i].Line < es[j].Line
		}
		return es[i].col < es[j].col
	})
	seen := make(map[string]bool, len(es))
	out := es[:0]
	for _, e := range es {
		k := e.Error()
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, e)
	}
	return out
}

// suggest returns the candidate closest to s, or "" when none is close
// enough to be a plausible typo.
func suggest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := editDistance(strings.ToLower(s), c)
		if d < bestD && d < len(c) {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and transpositions of adjacent bytes cost one.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30 // not a typo; avoids quadratic work on long keys
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
