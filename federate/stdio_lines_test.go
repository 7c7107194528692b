package federate

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestJSONLines(t *testing.T) {
	long := `{"x":"` + strings.Repeat("a", 200<<10) + `"}`
	for _, c := range []struct {
		name, in, want string
		skipped        int
	}{
		{"messages only", "{\"a\":1}\n[{}]\n", "{\"a\":1}\n[{}]\n", 0},
		{"banner and blank lines", "server ready\n\n  \n{\"a\":1}\r\n", "{\"a\":1}\r\n", 3},
		{"indented message", "  \t{\"a\":1}\n", "  \t{\"a\":1}\n", 0},
		{"message longer than the buffer", long + "\nnoise\n" + long + "\n", long + "\n" + long + "\n", 1},
		{"noise longer than the buffer", strings.Repeat("n", 200<<10) + "\n{}\n", "{}\n", 1},
		{"last line unterminated", "noise\n{\"a\":1}", "{\"a\":1}", 1},
	} {
		skipped := 0
		j := newJSONLines(iotest.HalfReader(strings.NewReader(c.in)), func([]byte) { skipped++ })
		got, err := io.ReadAll(iotest.OneByteReader(j))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(got) != c.want || skipped != c.skipped {
			t.Errorf("%s: read %d bytes (want %d), %d lines skipped (want %d)", c.name, len(got), len(c.want), skipped, c.skipped)
		}
	}
}
