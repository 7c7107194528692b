package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"", 8, ""},
		{"abcdefgh", 8, "abcdefgh"},
		{"abcdefghi", 8, "abcde…"},
		{"ééééé", 8, "éé…"},  // 10 bytes; 5 is inside the third é: cut at 4
		{"aéééé", 8, "aéé…"}, // 9 bytes; 5 starts an é: cut there
		{"\xff\xff\xff\xff\xff\xff\xff\xff\xff", 8, "\xff\xff\xff\xff\xff…"},
	} {
		if got := String(tc.s, tc.n); got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func FuzzString(f *testing.F) {
	f.Add("héllo wörld", 7)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < len(Mark) || n > 1<<20 {
			return
		}
		got := String(s, n)
		if len(got) > n {
			t.Fatalf("String(%q, %d) has %d bytes", s, n, len(got))
		}
		if got == s {
			return
		}
		if !strings.HasSuffix(got, Mark) || !strings.HasPrefix(s, strings.TrimSuffix(got, Mark)) {
			t.Fatalf("String(%q, %d) = %q: not a prefix followed by the mark", s, n, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("String(%q, %d) = %q cuts a rune", s, n, got)
		}
	})
}
