// Package clip bounds strings that come from clients before they are
// logged, audited or recorded on a span: a name can be as long as a
// request body, and a log line or a trace is read and stored far more
// cheaply than it is sent.
package clip

// Mark ends a string that was cut.
const Mark = "…"

// String returns s when it has at most n bytes, else its longest prefix
// that, followed by Mark, has at most n bytes and ends on a UTF-8 boundary,
// followed by Mark. n must be at least len(Mark).
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	c := n - len(Mark)
	for c > 0 && s[c]&0xc0 == 0x80 { // not inside a rune
		c--
	}
	return s[:c] + Mark
}
