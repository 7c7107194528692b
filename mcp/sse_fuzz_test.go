package mcp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzEventReader: for any stream and event size limit, eventReader never
// panics and
//   - relays byte for byte: the raw bytes of the events it returns, joined,
//     are the stream (less a leading BOM it skips), up to where it stops;
//   - reads each event's data, name and id as the SSE spec does (data lines
//     joined with "\n", "data" alone or "data:" gives an empty line);
//   - rewriteEventData on an event with data (then terminate, when the
//     upstream left it unterminated), read back, gives the new data, the
//     same name and the same id flag; terminate of an unterminated event, read
//     back, gives the same event.
func FuzzEventReader(f *testing.F) {
	for _, s := range []string{
		"event: message\ndata: {\"a\":1}\n\n",
		"id: 1\ndata: a\ndata: b\n\n: comment\n\ndata\n\n",
		"\xef\xbb\xbfdata: x\r\n\r\n",
		"data: x\rdata: y\n\n",
		"data: unterminated",
		"event:  message \ndata: x\n\n",
		"id:\ndata:x\n\nretry: 5\n\n",
		"data: \u2028\n\n",
	} {
		f.Add([]byte(s), uint16(4096))
	}
	f.Fuzz(func(t *testing.T, stream []byte, limit uint16) {
		max := int(limit)%8192 + 1
		er := newEventReader(bytes.NewReader(stream), max)
		var relayed []byte
		for n := 0; ; n++ {
			ev, err := er.next()
			if err != nil {
				if errors.Is(err, io.EOF) {
					rest := stream
					if strings.HasPrefix(string(rest), bom) {
						rest = rest[len(bom):]
					}
					if strings.HasPrefix(string(rest), latin1BOM) {
						rest = rest[len(latin1BOM):]
					}
					if !bytes.Equal(relayed, rest) {
						t.Fatalf("relayed %q of stream %q", relayed, stream)
					}
				}
				return
			}
			if n > len(stream)+1 {
				t.Fatalf("more events than bytes in %q", stream)
			}
			relayed = append(relayed, ev.raw...)
			data, name, hasID, hasData := specRead(ev.raw)
			// an empty data buffer is not dispatched (SSE spec): nil and
			// empty data are alike to every client
			if (len(data) > 0) != (len(ev.data) > 0) || hasData && len(data) > 0 && string(data) != string(ev.data) || name != ev.name || hasID != ev.hasID {
				t.Fatalf("event %q: read data %q (%v) name %q id %v; spec: %q (%v) %q %v",
					ev.raw, ev.data, ev.data != nil, ev.name, ev.hasID, data, hasData, name, hasID)
			}
			raw := append([]byte(nil), ev.raw...)
			if ev.unterminated {
				tr := terminate(raw)
				d2, n2, id2, h2 := specRead(tr)
				if string(d2) != string(data) || n2 != name || id2 != hasID || h2 != hasData || !bytes.HasSuffix(tr, []byte("\n\n")) && !bytes.HasSuffix(tr, []byte("\n\r\n")) {
					t.Fatalf("terminate(%q) = %q reads differently", raw, tr)
				}
			}
			if len(ev.data) > 0 {
				// as the relay does: rewritten, then terminated when the
				// upstream left it so
				rw := rewriteEventData(raw, []byte(`{"x":1}`))
				if ev.unterminated {
					rw = terminate(rw)
				}
				back, err := newEventReader(bytes.NewReader(rw), 1<<20).next()
				if err != nil || string(back.data) != `{"x":1}` || back.name != ev.name || back.hasID != ev.hasID || back.unterminated {
					t.Fatalf("rewriteEventData(%q) = %q reads back as %+v, %v", raw, rw, back, err)
				}
			}
		}
	})
}

// specRead interprets one event's raw lines (ended by "\n" or "\r\n") as the
// SSE spec does.
func specRead(raw []byte) (data []byte, name string, hasID, hasData bool) {
	var lines []string
	for _, l := range strings.SplitAfter(string(raw), "\n") {
		if l == "" {
			continue
		}
		l = strings.TrimSuffix(strings.TrimSuffix(l, "\n"), "\r")
		lines = append(lines, l)
	}
	var d []string
	for _, l := range lines {
		if l == "" || l[0] == ':' {
			continue
		}
		field, value, _ := strings.Cut(l, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			d = append(d, value)
		case "event":
			name = value
		case "id":
			hasID = hasID || value != ""
		}
	}
	if d != nil {
		return []byte(strings.Join(d, "\n")), name, hasID, true
	}
	return nil, name, hasID, false
}
