package federate

import (
	"cmp"
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/clip"
)

func TestJSONLines(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"result":{}}`
	long := `{"jsonrpc":"2.0","id":1,"result":{"x":"` + strings.Repeat("a", 200<<10) + `"}}`
	bigLog := `{"level":30,"msg":"request","body":"` + strings.Repeat("x", 200<<10) + `"}`
	// An answer past the bound whose id comes last, after strings that
	// hold quotes, escapes and brackets.
	idLast := `{"result":{"content":[{"type":"text","text":"a\"}]{\\","x":"` + strings.Repeat("b", 200<<10) + `"}]},"jsonrpc":"2.0","id":"c-7"}`
	request := `{"jsonrpc":"2.0","id":2,"method":"sampling/createMessage","params":{"x":"` + strings.Repeat("a", 200<<10) + `"}}`
	tooLarge := func(id string, max int) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32603,"message":"federate: upstream answer over ` + strconv.Itoa(max) + ` bytes"}}` + "\n"
	}
	for _, c := range []struct {
		name, in, want string
		skipped        int
		max            int // 1 MiB when 0
		oversize       int
	}{
		{"messages only", msg + "\n[" + msg + "]\n", msg + "\n[" + msg + "]\n", 0, 0, 0},
		{"banner and blank lines", "server ready\n\n  \n" + msg + "\r\n", msg + "\r\n", 3, 0, 0},
		{"log lines that start like JSON", "[INFO] up\n{\"level\":30}\n" + msg + "\n", msg + "\n", 2, 0, 0},
		{"arrays that are no batch", `["server ready"]` + "\n[]\n[" + msg + `,"x"]` + "\n" + msg + "\n", msg + "\n", 3, 0, 0},
		{"objects that are no message", `{"jsonrpc":"2.0"}` + "\n" + `{"jsonrpc":"1.0","id":1}` + "\n" + msg + "\n", msg + "\n", 2, 0, 0},
		{"indented message", "  \t" + msg + "\n", "  \t" + msg + "\n", 0, 0, 0},
		{"message and text after it", msg + " <- sent\n" + msg + `{"level":30}` + "\n" + msg + "\n", msg + "\n", 2, 0, 0},
		{"message and spaces after it", msg + " \n" + msg + "\t\r\n" + msg + " \r \r\n" + msg + " ", msg + "\n" + msg + "\r\n" + msg + "\r\n" + msg, 0, 0, 0},
		{"batch and spaces after it", "[" + msg + "] \n", "[" + msg + "]\n", 0, 0, 0},
		{"message longer than the buffer and spaces after it", long + " \t\n", long + "\n", 0, 0, 0},
		{"message longer than the buffer", long + "\nnoise\n" + long + "\n", long + "\n" + long + "\n", 1, 0, 0},
		{"JSON log longer than the buffer", bigLog + "\n" + msg + "\n", msg + "\n", 1, 0, 0},
		{"noise longer than the buffer", strings.Repeat("n", 200<<10) + "\n" + msg + "\n", msg + "\n", 1, 0, 0},
		{"message of the bound", msg + "\n" + msg + "\n", msg + "\n" + msg + "\n", 0, len(msg), 0},
		{"last line unterminated", "noise\n" + msg, msg, 1, 0, 0},
		{"answer past the bound", long + "\n" + msg + "\n", tooLarge("1", 100<<10) + msg + "\n", 0, 100 << 10, 1},
		{"answer past the bound, its id last", idLast + "\n" + msg + "\n", tooLarge(`"c-7"`, 100<<10) + msg + "\n", 0, 100 << 10, 1},
		{"answer a byte past the bound", msg + "\n", tooLarge("1", len(msg)-1), 0, len(msg) - 1, 1},
		{"request past the bound", request + "\n" + msg + "\n", msg + "\n", 1, 100 << 10, 0},
		{"batch past the bound", "[" + long + "]\n" + msg + "\n", msg + "\n", 1, 100 << 10, 0},
		{"JSON log past the bound", bigLog + "\n" + msg + "\n", msg + "\n", 1, 100 << 10, 0},
	} {
		skipped, oversize := 0, 0
		j := newJSONLines(iotest.HalfReader(strings.NewReader(c.in)), cmp.Or(c.max, 1<<20), func([]byte) { skipped++ }, func([]byte, jsonrpc.ID) { oversize++ })
		got, err := io.ReadAll(iotest.OneByteReader(j))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(got) != c.want || skipped != c.skipped || oversize != c.oversize {
			t.Errorf("%s: read %s (want %s), %d lines skipped (want %d), %d answers too large (want %d)",
				c.name, clip.String(string(got), 200), clip.String(c.want, 200), skipped, c.skipped, oversize, c.oversize)
		}
	}
}

// sdkReads feeds each line, then an answer, through jsonLines into the
// SDK's own stdio connection (mcp.IOTransport, as startProcess reads a
// process): the SDK must read want messages of it (the line's, if it
// passes, and the answer), then the end. A read that fails otherwise ends
// the session every tenant of the process shares.
func sdkReads(t *testing.T, want int, lines ...string) {
	t.Helper()
	for _, line := range lines {
		in := line + `{"jsonrpc":"2.0","id":1,"result":{}}` + "\n"
		jl := newJSONLines(strings.NewReader(in), 1<<20, func([]byte) {}, func([]byte, jsonrpc.ID) {})
		conn, err := (&mcp.IOTransport{Reader: io.NopCloser(jl), Writer: nopWriteCloser{}}).Connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			_, err := conn.Read(context.Background())
			if i == want {
				if !errors.Is(err, io.EOF) {
					t.Errorf("line %q: the SDK's read %d: %v, want the end", line, i, err)
				}
				break
			}
			if err != nil {
				t.Errorf("line %q: the SDK's read %d failed: %v", line, i, err)
				break
			}
		}
		_ = conn.Close()
	}
}

type nopWriteCloser struct{}

func (nopWriteCloser) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriteCloser) Close() error                { return nil }

const logMessage = `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}`

// A message followed by text on its line ("{...} <- sent", a JSON log
// line after it) is no message: the SDK's stdio connection refuses a
// value followed by anything but a newline ("invalid trailing data") and
// ends the session. Judged by jsonrpc.DecodeMessage alone, which reads the
// first value and ignores the rest, it reached the SDK.
func TestJSONLinesMessageWithTextAfterItIsSkipped(t *testing.T) {
	sdkReads(t, 1, logMessage+" <- sent\n", logMessage+`{"level":30}`+"\n", logMessage+"\r<- sent\n")
}

// A message with spaces or tabs before its newline is a message, but the
// SDK refuses it as it refuses text after one: it reaches the SDK without
// them.
func TestJSONLinesMessageWithSpacesAfterItReachesTheSDK(t *testing.T) {
	sdkReads(t, 2, logMessage+" \n", logMessage+"\t\n", logMessage+" \r\n", "["+logMessage+"]\t\n")
}
