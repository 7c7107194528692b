package federate

import (
	"cmp"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestJSONLines(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"result":{}}`
	long := `{"jsonrpc":"2.0","id":1,"result":{"x":"` + strings.Repeat("a", 200<<10) + `"}}`
	bigLog := `{"level":30,"msg":"request","body":"` + strings.Repeat("x", 200<<10) + `"}`
	for _, c := range []struct {
		name, in, want string
		skipped        int
		max            int // 1 MiB when 0
	}{
		{"messages only", msg + "\n[" + msg + "]\n", msg + "\n[" + msg + "]\n", 0, 0},
		{"banner and blank lines", "server ready\n\n  \n" + msg + "\r\n", msg + "\r\n", 3, 0},
		{"log lines that start like JSON", "[INFO] up\n{\"level\":30}\n" + msg + "\n", msg + "\n", 2, 0},
		{"arrays that are no batch", `["server ready"]` + "\n[]\n[" + msg + `,"x"]` + "\n" + msg + "\n", msg + "\n", 3, 0},
		{"objects that are no message", `{"jsonrpc":"2.0"}` + "\n" + `{"jsonrpc":"1.0","id":1}` + "\n" + msg + "\n", msg + "\n", 2, 0},
		{"indented message", "  \t" + msg + "\n", "  \t" + msg + "\n", 0, 0},
		{"message longer than the buffer", long + "\nnoise\n" + long + "\n", long + "\n" + long + "\n", 1, 0},
		{"JSON log longer than the buffer", bigLog + "\n" + msg + "\n", msg + "\n", 1, 0},
		{"noise longer than the buffer", strings.Repeat("n", 200<<10) + "\n" + msg + "\n", msg + "\n", 1, 0},
		{"message of the bound", msg + "\n" + msg + "\n", msg + "\n" + msg + "\n", 0, len(msg)},
		{"last line unterminated", "noise\n" + msg, msg, 1, 0},
	} {
		skipped := 0
		j := newJSONLines(iotest.HalfReader(strings.NewReader(c.in)), cmp.Or(c.max, 1<<20), func([]byte) { skipped++ })
		got, err := io.ReadAll(iotest.OneByteReader(j))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(got) != c.want || skipped != c.skipped {
			t.Errorf("%s: read %d bytes (want %d), %d lines skipped (want %d)", c.name, len(got), len(c.want), skipped, c.skipped)
		}
	}
}
