package federate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// lineKeep is the largest line buffer jsonLines keeps for the next line: a
// larger one, grown for a rare long message, is let go.
const lineKeep = 1 << 20

// jsonLines is a stdio server's stdout as its session reads it: the lines
// that hold a JSON-RPC message (or a batch of them), the others dropped.
// MCP's stdio transport carries one message per line and nothing else,
// yet servers print banners, debug output and JSON logs there; the Go
// SDK's client ends the session at the first such line (failing the calls
// in flight of every tenant sharing the process), where the TypeScript
// SDK's skips it. A line is judged whole (one JSON value, which the SDK's
// own decoding takes as a message: see holdsMessage), and passed on
// without the spaces and tabs before its newline, which the SDK refuses;
// so one that can hold a message ('{' or '[' first) is held until its end,
// up to max bytes; a longer one is dropped, and if it is an answer it is
// answered with an error for its id (see tooLarge). skipped is told each
// dropped line's first chunk (up to the buffer's size), oversize each
// answer dropped for its size.
type jsonLines struct {
	br       *bufio.Reader
	max      int // the most bytes of a line, its "\n" not counted
	skipped  func(line []byte)
	oversize func(head []byte, id jsonrpc.ID)

	line []byte // the current line, when longer than br's buffer
	rest []byte // of the current message, not yet read
	err  error  // the read error, returned once rest is empty
}

func newJSONLines(r io.Reader, max int, skipped func([]byte), oversize func([]byte, jsonrpc.ID)) *jsonLines {
	return &jsonLines{br: bufio.NewReaderSize(r, 64<<10), max: max, skipped: skipped, oversize: oversize}
}

var newline = []byte("\n")

func (j *jsonLines) Read(p []byte) (int, error) {
	for len(j.rest) == 0 {
		if j.err != nil {
			return 0, j.err
		}
		// rest is empty: what it pointed into (br's buffer, or line) is
		// free.
		j.rest = j.next()
	}
	n := copy(p, j.rest)
	j.rest = j.rest[n:]
	return n, nil
}

// next reads a line and returns it if it holds a message, else nil; a
// read error is kept in err.
func (j *jsonLines) next() []byte {
	// The last line is read (rest is empty): a buffer grown past lineKeep
	// for it is let go now, whatever the next line is. Kept until a long
	// line came again, it stayed pinned (up to max, and past it) while
	// only short lines, read in br's buffer, followed.
	if cap(j.line) > lineKeep {
		j.line = nil
	}
	chunk, err := j.br.ReadSlice('\n')
	more := errors.Is(err, bufio.ErrBufferFull)
	if !more {
		j.setErr(err)
	}
	if len(chunk) == 0 {
		return nil
	}
	if t := bytes.TrimLeft(chunk, " \t\r"); len(t) == 0 || (t[0] != '{' && t[0] != '[') {
		// Not JSON: dropped as it is read, however long.
		j.skipped(chunk)
		for more {
			_, err = j.br.ReadSlice('\n')
			more = errors.Is(err, bufio.ErrBufferFull)
		}
		j.setErr(err)
		return nil
	}
	line := chunk
	var past *skeleton // the line is past max: its top level, for its id
	if more {
		j.line = append(j.line[:0], chunk...)
		for more {
			chunk, err = j.br.ReadSlice('\n')
			more = errors.Is(err, bufio.ErrBufferFull)
			if past != nil {
				past.feed(chunk)
				continue
			}
			j.line = append(j.line, chunk...)
			if len(bytes.TrimSuffix(j.line, newline)) > j.max {
				past = new(skeleton)
				past.feed(j.line)
			}
		}
		j.setErr(err)
		line = j.line
	}
	if past == nil && len(bytes.TrimSuffix(line, newline)) > j.max {
		past = new(skeleton)
		past.feed(line)
	}
	if past != nil {
		head := line[:min(len(line), j.br.Size())]
		if id, ok := past.responseID(); ok {
			j.oversize(head, id)
			return j.tooLarge(id)
		}
		j.skipped(head)
		return nil
	}
	text, eol := splitEnd(line)
	if !holdsMessage(text) {
		j.skipped(line[:min(len(line), j.br.Size())])
		return nil
	}
	if len(text)+len(eol) == len(line) {
		return line
	}
	// Spaces or tabs before the newline: the SDK refuses a message
	// followed by anything but its newline, ending the session.
	j.line = append(append(j.line[:0], text...), eol...) // text may be j.line's start: copied onto itself
	return j.line
}

// splitEnd splits a line into its text and its newline ("\r\n", "\n", or
// none: the last line, unterminated), leaving out the spaces, tabs and
// carriage returns between them.
func splitEnd(line []byte) (text []byte, eol string) {
	text = bytes.TrimRight(line, " \t\r\n")
	switch {
	case bytes.HasSuffix(line, []byte("\r\n")):
		eol = "\r\n"
	case bytes.HasSuffix(line, newline):
		eol = "\n"
	}
	return text, eol
}

// tooLarge is the line the session reads in place of an answer past max:
// an error for the call it answers, as an HTTP upstream's answer past the
// bound fails its call alone. The line itself reaching the SDK would end
// the session, failing every call in flight on the process, whichever
// tenant's.
func (j *jsonLines) tooLarge(id jsonrpc.ID) []byte {
	b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{
		Code:    jsonrpc.CodeInternalError,
		Message: fmt.Sprintf("federate: upstream answer over %d bytes", j.max),
	}})
	if err != nil { // an id the SDK decoded encodes
		return nil
	}
	return append(b, '\n')
}

func (j *jsonLines) setErr(err error) {
	if err != nil {
		j.err = err
	}
}

// holdsMessage reports whether the text of a line (see splitEnd) is one
// JSON-RPC message, or a batch of them (which the SDK's client accepts,
// and servers of protocol versions before 2025-06-18 may send), as the SDK
// decodes them: "[INFO] ...", a JSON logger's {"level":30,...} or an array
// printed to stdout are output, not messages. It must be exactly one JSON
// value: jsonrpc.DecodeMessage reads the first and ignores what follows
// ("{...} <- sent", "{...}{...}"), but the SDK's stdio connection refuses
// a value followed by anything but its newline, ending the session.
func holdsMessage(text []byte) bool {
	t := bytes.TrimLeft(text, " \t\r")
	if len(t) == 0 {
		return false
	}
	switch t[0] {
	case '{':
		if !json.Valid(t) {
			return false
		}
		_, err := jsonrpc.DecodeMessage(t)
		return err == nil
	case '[':
		var batch []json.RawMessage
		if json.Unmarshal(t, &batch) != nil || len(batch) == 0 {
			return false
		}
		for _, m := range batch {
			if _, err := jsonrpc.DecodeMessage(m); err != nil {
				return false
			}
		}
		return true
	}
	return false
}

// Bounds of a skeleton.
const (
	// skeletonMax is the most bytes of a line's top level a skeleton keeps:
	// a message's has a few members.
	skeletonMax = 4 << 10
	// skeletonString is the longest string of the top level a skeleton
	// keeps: a longer one (no id, version or method) becomes "".
	skeletonString = 1 << 10
)

// skeleton is the top level of one JSON line, fed in chunks, kept in
// bounded memory: what is nested deeper is left out ("result":{...}
// becomes "result":{}), and so is a long string. It is what decides
// whether a line too long to be held is an answer, and to which request:
// its id may come last (the TypeScript SDK writes {"result":...,
// "jsonrpc":"2.0","id":1}). Its bytes are judged by the SDK's decoding: a
// line that is not one JSON value may leave a skeleton that is one, but
// such a line is dropped either way, and only an answer's id is taken from
// it.
type skeleton struct {
	out   []byte
	depth int
	inStr bool
	esc   bool
	str   []byte // the current top-level string, while short
	long  bool   // the current string is past skeletonString
	full  bool   // out reached skeletonMax: the line is not judged
}

func (s *skeleton) feed(b []byte) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if s.inStr {
			switch {
			case s.esc:
				s.esc = false
				s.strBytes(b[i : i+1])
			case c == '\\':
				s.esc = true
				s.strBytes(b[i : i+1])
			case c == '"':
				s.inStr = false
				if s.depth <= 1 {
					s.emit('"')
					if !s.long {
						s.emit(s.str...)
					}
					s.emit('"')
				}
			default: // up to the next quote or escape at once
				k := bytes.IndexAny(b[i:], `"\`)
				if k < 0 {
					k = len(b) - i
				}
				s.strBytes(b[i : i+k])
				i += k - 1
			}
			continue
		}
		switch c {
		case '"':
			s.inStr, s.str, s.long = true, s.str[:0], false
		case '{', '[':
			s.depth++
			if s.depth <= 2 {
				s.emit(c)
			}
		case '}', ']':
			if s.depth <= 2 {
				s.emit(c)
			}
			s.depth--
		default:
			if s.depth <= 1 {
				s.emit(c)
			}
		}
	}
}

func (s *skeleton) strBytes(p []byte) {
	if s.depth > 1 || s.long {
		return
	}
	if len(s.str)+len(p) > skeletonString {
		s.long = true
		return
	}
	s.str = append(s.str, p...)
}

func (s *skeleton) emit(p ...byte) {
	if len(s.out)+len(p) > skeletonMax {
		s.full = true
		return
	}
	s.out = append(s.out, p...)
}

// responseID returns the id of the answer the line is, if it is one.
func (s *skeleton) responseID() (jsonrpc.ID, bool) {
	if s.full {
		return jsonrpc.ID{}, false
	}
	msg, err := jsonrpc.DecodeMessage(s.out)
	if err != nil {
		return jsonrpc.ID{}, false
	}
	if resp, ok := msg.(*jsonrpc.Response); ok {
		return resp.ID, true
	}
	return jsonrpc.ID{}, false // a request of the server's: dropped
}
