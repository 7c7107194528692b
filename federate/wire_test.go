package federate

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// countLines is what counted must find: the lines naming a progress or log
// notification in their first maxCounted bytes.
func countLines(data []byte) int64 {
	var n int64
	lines := bytes.Split(data, []byte("\n"))
	for i, l := range lines {
		if i == len(lines)-1 {
			break // no newline after it: not a complete line
		}
		l = l[:min(len(l), maxCounted)]
		if bytes.Contains(l, progressMethod) || bytes.Contains(l, logMethod) {
			n++
		}
	}
	return n
}

func TestCounted(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int64
	}{
		{"sse", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n" +
			"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n", 1},
		{"stdio lines", `{"method":"notifications/message"}` + "\n" + `{"method":"notifications/progress"}` + "\n", 2},
		{"escaped in a string", `{"result":{"text":"\"notifications/progress\""}}` + "\n", 0},
		{"no newline yet", `{"method":"notifications/progress"}`, 0},
		{"long notification", `{"method":"notifications/message","params":{"data":"` + strings.Repeat("x", 4*maxCounted) + `"}}` + "\n", 1},
		{"method past the counted start", strings.Repeat("x", maxCounted) + `"notifications/progress"` + "\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := new(wireCount)
			// One byte at a time: a line split over reads is still one line.
			c := &counted{r: &oneByte{r: bytes.NewReader([]byte(tt.in))}, w: w}
			if _, err := io.ReadAll(c); err != nil {
				t.Fatal(err)
			}
			if got := w.seen.Load(); got != tt.want {
				t.Errorf("counted %d, want %d", got, tt.want)
			}
		})
	}
}

// FuzzCounted: whatever the bytes and however they are split into reads,
// counted passes them through unchanged and counts what countLines counts.
func FuzzCounted(f *testing.F) {
	f.Add([]byte("data: {\"method\":\"notifications/progress\"}\n\n"), uint8(3))
	f.Add([]byte(`{"method":"notifications/message"}`+"\n"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		w := new(wireCount)
		c := &counted{r: &chunked{r: bytes.NewReader(data), n: int(chunk)%16 + 1}, w: w}
		out, err := io.ReadAll(c)
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("read %q, %v; want the input unchanged", out, err)
		}
		if got, want := w.seen.Load(), countLines(data); got != want {
			t.Fatalf("counted %d, want %d", got, want)
		}
	})
}

type oneByte struct{ r io.Reader }

func (o *oneByte) Read(p []byte) (int, error) { return o.r.Read(p[:min(1, len(p))]) }

type chunked struct {
	r io.Reader
	n int
}

func (c *chunked) Read(p []byte) (int, error) { return c.r.Read(p[:min(c.n, len(p))]) }
