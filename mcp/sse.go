package mcp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// errEventTooLarge means one server-sent event exceeded the size limit.
var errEventTooLarge = fmt.Errorf("%w: server-sent event too large", ErrBadUpstreamResponse)

// sseEvent is one server-sent event as read from the upstream: its raw bytes
// (every line, including the blank line that ends it) plus the fields the
// proxy inspects. raw and data are only valid until the next call to next.
type sseEvent struct {
	raw   []byte
	data  []byte // data lines joined with "\n"; nil when there were none
	name  string // event field, "" when absent
	hasID bool   // the event set a non-empty id without NUL (the stream is resumable)
	// unterminated: the stream ended before the event's blank line (raw
	// is as it came; see terminate).
	unterminated bool
}

// eventReader splits an SSE stream into events without interpreting more
// than it must, so that events can be relayed byte for byte. Lines end in
// "\n" or "\r\n" (MCP servers write "\n"); a line ended by a bare "\r" is
// refused (errBareCR), and a leading BOM skipped.
type eventReader struct {
	br   *bufio.Reader
	max  int
	raw  []byte
	data []byte
	read bool // an event was read: a BOM is skipped before the first only
}

func newEventReader(r io.Reader, max int) *eventReader {
	return &eventReader{br: bufio.NewReaderSize(r, 32<<10), max: max}
}

// next returns the next event. At the end of the stream a final event that
// lacks its terminating blank line is returned as is; then io.EOF.
func (er *eventReader) next() (sseEvent, error) {
	if !er.read {
		// A stream may start with a UTF-8 BOM, which clients' decoders
		// drop: skipped, so the first field is read as they read it.
		er.read = true
		if b, err := er.br.Peek(len(bom)); err == nil && string(b) == bom {
			_, _ = er.br.Discard(len(bom))
		}
		// eventsource-parser (the TypeScript SDK's) also drops a leading
		// U+00EF U+00BB U+00BF (a BOM decoded as Latin-1, then re-encoded):
		// dropped here too, so every client reads the first line as we do.
		if b, err := er.br.Peek(len(latin1BOM)); err == nil && string(b) == latin1BOM {
			_, _ = er.br.Discard(len(latin1BOM))
		}
	}
	er.raw = er.raw[:0]
	er.data = er.data[:0]
	ev := sseEvent{}
	hasData := false
	lineStart := 0
	for {
		chunk, err := er.br.ReadSlice('\n')
		if len(er.raw)+len(chunk) > er.max {
			return sseEvent{}, fmt.Errorf("%w: over %d bytes", errEventTooLarge, er.max)
		}
		er.raw = append(er.raw, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // the line goes on
		}
		line := bytes.TrimSuffix(er.raw[lineStart:], []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if bytes.IndexByte(line, '\r') >= 0 {
			// A bare CR ends a line for clients (the TypeScript SDK's
			// parser, the SSE spec) but not here: refused rather than read
			// differently, which could hide a response from the filters.
			return sseEvent{}, errBareCR
		}
		complete := err == nil
		if complete && len(line) == 0 {
			ev.raw = er.raw
			break // blank line: end of event
		}
		if len(line) > 0 {
			field, value, _ := bytes.Cut(line, []byte{':'})
			value = bytes.TrimPrefix(value, []byte{' '})
			if string(field) != "data" {
				if ferr := readAlike(line, field, value); ferr != nil {
					return sseEvent{}, ferr
				}
			}
			switch string(field) {
			case "data":
				if hasData {
					er.data = append(er.data, '\n')
				}
				hasData = true
				er.data = append(er.data, value...)
			case "event":
				ev.name = string(value)
			case "id":
				// An id holding NUL is ignored by clients (the SSE spec,
				// the TypeScript and Python parsers; no HTTP header could
				// carry it back as Last-Event-ID): it makes nothing
				// resumable.
				ev.hasID = ev.hasID || len(value) > 0 && bytes.IndexByte(value, 0) < 0
			}
		}
		lineStart = len(er.raw)
		if err != nil {
			if len(er.raw) == 0 || !errors.Is(err, io.EOF) {
				return sseEvent{}, err
			}
			ev.raw, ev.unterminated = er.raw, true // the last event, as it came
			break
		}
	}
	if hasData {
		ev.data = er.data
	}
	return ev, nil
}

// bom is the UTF-8 byte order mark.
const bom = "\xef\xbb\xbf"

// readAlike refuses a line other than data that the clients read
// differently from one another, which could hide a response from the
// filters (data lines are JSON, where the same characters are harmless):
//   - a character Python's str.splitlines ends lines at (httpx's
//     aiter_lines, which httpx-sse before 0.4.2 reads events with): a data
//     line hidden in an id, event or comment line;
//   - an event or id value padded with whitespace: the Go SDK's client
//     trims it, the TypeScript and Python ones do not ("message " is the
//     answer for one and an ignored event for the others, "id:  " a
//     resumable stream for the proxy only).
func readAlike(line, field, value []byte) error {
	switch {
	case bytes.ContainsFunc(line, isSplitlinesBreak):
		return errUnicodeBreak
	case (string(field) == "event" || string(field) == "id") && len(bytes.TrimSpace(value)) != len(value):
		return errSpacedField
	}
	return nil
}

// latin1BOM is U+00EF U+00BB U+00BF in UTF-8.
const latin1BOM = "\u00ef\u00bb\u00bf"

// isSplitlinesBreak reports whether Python's str.splitlines ends a line at
// r where the SSE spec does not (CR and LF are handled apart).
func isSplitlinesBreak(r rune) bool {
	switch r {
	case '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
		return true
	}
	return false
}

// errSpacedField means an event or id field has leading or trailing
// whitespace (beyond the one space after the colon).
var errSpacedField = fmt.Errorf("%w: event stream event or id field with leading or trailing whitespace", ErrBadUpstreamResponse)

// errUnicodeBreak means a non-data line holds a character some clients end lines at.
var errUnicodeBreak = fmt.Errorf("%w: event stream line holds a Unicode line break outside data", ErrBadUpstreamResponse)

// errBareCR means the stream ends a line with a lone CR.
var errBareCR = fmt.Errorf("%w: event stream line ends with a bare CR", ErrBadUpstreamResponse)

// terminate returns out, the client's copy of an event the upstream left
// unterminated at the end of its stream, with the blank line that ends
// it: the client reads it as the proxy did, and what the proxy writes after
// it (an error event answering the call) starts an event of its own instead
// of continuing that one.
func terminate(out []byte) []byte {
	out = out[:len(out):len(out)] // never append into the reader's buffer
	switch {
	case bytes.HasSuffix(out, []byte("\n\n")), bytes.HasSuffix(out, []byte("\n\r\n")):
		return out // rewritten: already ended
	case bytes.HasSuffix(out, []byte("\n")):
		return append(out, '\n')
	}
	return append(out, '\n', '\n')
}

// rewriteEventData returns the event raw with its data lines replaced by a
// single data line holding data (which must contain no newline), keeping the
// other lines (id, event, retry, comments) in place.
func rewriteEventData(raw, data []byte) []byte {
	out := make([]byte, 0, len(raw)+len(data))
	wrote := false
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line = raw[:i+1]
		}
		raw = raw[len(line):]
		field, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte{':'})
		if string(field) != "data" {
			if len(bytes.TrimRight(line, "\r\n")) == 0 && !wrote {
				out = appendDataLine(out, data)
				wrote = true
			}
			out = append(out, line...)
			continue
		}
		if !wrote {
			out = appendDataLine(out, data)
			wrote = true
		}
	}
	if !wrote {
		out = appendDataLine(out, data)
	}
	if !bytes.HasSuffix(out, []byte("\n\n")) && !bytes.HasSuffix(out, []byte("\n\r\n")) {
		out = append(out, '\n')
	}
	return out
}

func appendDataLine(dst, data []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, '\n')
}

// errorEvent is an SSE event carrying a JSON-RPC error response.
func errorEvent(id json.RawMessage, code int, message string) []byte {
	b := appendDataLine([]byte("event: message\n"), errorResponse(id, code, message, nil))
	return append(b, '\n')
}
