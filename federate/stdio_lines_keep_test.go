package federate

import (
	"io"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// lineKeep is "the largest line buffer jsonLines keeps for the next line:
// a larger one, grown for a rare long message, is let go". It is let go
// once its long line is read: after a long message and then only short
// ones, jsonLines holds no buffer past lineKeep. (Once, it was let go only
// when the next long line started, so a stdio server that once answered
// 15 MiB and then only short messages kept those 15 MiB pinned for the
// life of its process.)
func TestJSONLinesLetsGoOfALongLinesBuffer(t *testing.T) {
	pr, pw := io.Pipe()
	defer pr.Close()
	long := `{"jsonrpc":"2.0","id":1,"result":{"x":"` + strings.Repeat("a", 4<<20) + `"}}` + "\n"
	short := `{"jsonrpc":"2.0","id":2,"result":{}}` + "\n"
	go func() {
		_, _ = io.WriteString(pw, long)
		_, _ = io.WriteString(pw, short)
		_, _ = io.WriteString(pw, short)
		// the process goes on running: stdout stays open
	}()
	j := newJSONLines(pr, 16<<20, func([]byte) {}, func([]byte, jsonrpc.ID) {})
	want := len(long) + 2*len(short)
	buf := make([]byte, 32<<10)
	got := 0
	for got < want {
		n, err := j.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if c := cap(j.line); c > lineKeep {
		t.Errorf("after two short messages jsonLines still holds a line buffer of %d bytes (lineKeep %d)", c, lineKeep)
	}
}
