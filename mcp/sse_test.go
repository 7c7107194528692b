package mcp

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestEventReader(t *testing.T) {
	stream := ": comment\r\n\r\nid: 1\r\nevent: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nretry: 10\n\ndata: tail"
	er := newEventReader(strings.NewReader(stream), 1<<10)
	var raws []string
	var datas []string
	for {
		ev, err := er.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, string(ev.raw))
		datas = append(datas, fmt.Sprintf("%v|%s|%q", ev.hasID, ev.name, ev.data))
	}
	if strings.Join(raws, "") != stream {
		t.Fatalf("raw events do not reassemble the stream: %q", raws)
	}
	want := []string{`false||""`, `true|message|"{\"a\":\n1}"`, `false||""`, `false||"tail"`}
	if strings.Join(datas, ",") != strings.Join(want, ",") {
		t.Fatalf("events %q\nwant   %q", datas, want)
	}

	er = newEventReader(strings.NewReader("data: "+strings.Repeat("x", 100)+"\n\n"), 50)
	if _, err := er.next(); !errors.Is(err, errEventTooLarge) {
		t.Fatalf("oversize event: %v", err)
	}
	// A line longer than the bufio buffer is still one line.
	long := "data: " + strings.Repeat("y", 100<<10) + "\n\n"
	er = newEventReader(strings.NewReader(long), 1<<20)
	if ev, err := er.next(); err != nil || len(ev.data) != 100<<10 || string(ev.raw) != long {
		t.Fatalf("long line: %v %d", err, len(ev.data))
	}
}

func TestEventReaderBOMAndBareCR(t *testing.T) {
	er := newEventReader(strings.NewReader("\xef\xbb\xbfdata: x\n\n"), 1<<10)
	if ev, err := er.next(); err != nil || string(ev.data) != "x" || string(ev.raw) != "data: x\n\n" {
		t.Fatalf("after a BOM: %q %q %v", ev.data, ev.raw, err)
	}
	for _, s := range []string{"id: 1\rdata: x\r\r", "data: x\r\r\n", ": c\rdata: y\n\n"} {
		er := newEventReader(strings.NewReader(s), 1<<10)
		if _, err := er.next(); !errors.Is(err, errBareCR) {
			t.Errorf("%q: %v, want errBareCR", s, err)
		}
	}
}

func TestTerminate(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"event:", "event:\n\n"},
		{"data: x\n", "data: x\n\n"},
		{"data: x\r\n", "data: x\r\n\n"},
		{"data: X\n\n", "data: X\n\n"},
	} {
		if got := string(terminate([]byte(tt.in))); got != tt.want {
			t.Errorf("terminate(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestRewriteEventData(t *testing.T) {
	tests := []struct{ in, want string }{
		{"data: a\n\n", "data: X\n\n"},
		{"id: 1\nevent: message\ndata: a\ndata: b\n: c\n\n", "id: 1\nevent: message\ndata: X\n: c\n\n"},
		{"id: 1\r\ndata: a\r\n\r\n", "id: 1\r\ndata: X\n\r\n"},
		{"data: unterminated", "data: X\n\n"},
	}
	for _, tt := range tests {
		if got := string(rewriteEventData([]byte(tt.in), []byte("X"))); got != tt.want {
			t.Errorf("rewrite(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
