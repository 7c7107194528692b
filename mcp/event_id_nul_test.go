package mcp

import (
	"strings"
	"testing"
)

// An id holding NUL sets no id (clients ignore it); a clean one in the
// same event still does.
func TestEventIDWithNULNotCounted(t *testing.T) {
	for _, tt := range []struct {
		stream string
		want   bool
	}{
		{"id: a\x00b\ndata: {}\n\n", false},
		{"id: \x00\ndata: {}\n\n", false},
		{"id: a\x00b\nid: c\ndata: {}\n\n", true},
		{"id: c\ndata: {}\n\n", true},
	} {
		ev, err := newEventReader(strings.NewReader(tt.stream), 1<<20).next()
		if err != nil || ev.hasID != tt.want {
			t.Errorf("%q: hasID %v, err %v; want %v", tt.stream, ev.hasID, err, tt.want)
		}
	}
}
