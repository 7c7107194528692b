package federate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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
// SDK's skips it. A line is judged whole (the SDK's own decoding decides),
// so one that can hold a message ('{' or '[' first) is held until its end,
// up to max bytes; a longer one is dropped. skipped is told each dropped
// line's first chunk (up to the buffer's size).
type jsonLines struct {
	br      *bufio.Reader
	max     int // the most bytes of a line, its "\n" not counted
	skipped func(line []byte)

	line []byte // the current line, when longer than br's buffer
	rest []byte // of the current message, not yet read
	err  error  // the read error, returned once rest is empty
}

func newJSONLines(r io.Reader, max int, skipped func([]byte)) *jsonLines {
	return &jsonLines{br: bufio.NewReaderSize(r, 64<<10), max: max, skipped: skipped}
}

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
	if more {
		if cap(j.line) > lineKeep {
			j.line = nil
		}
		j.line = append(j.line[:0], chunk...)
		for more {
			chunk, err = j.br.ReadSlice('\n')
			more = errors.Is(err, bufio.ErrBufferFull)
			if len(j.line) <= j.max { // past it, the rest is dropped
				j.line = append(j.line, chunk...)
			}
		}
		j.setErr(err)
		line = j.line
	}
	if len(bytes.TrimSuffix(line, []byte("\n"))) > j.max {
		j.skipped(line[:min(len(line), j.br.Size())])
		return nil
	}
	if !holdsMessage(line) {
		j.skipped(line[:min(len(line), j.br.Size())])
		return nil
	}
	return line
}

func (j *jsonLines) setErr(err error) {
	if err != nil {
		j.err = err
	}
}

// holdsMessage reports whether a whole line is one JSON-RPC message, or a
// batch of them (which the SDK's client accepts, and servers of protocol
// versions before 2025-06-18 may send), as the SDK decodes them: "[INFO]
// ...", a JSON logger's {"level":30,...} or an array printed to stdout are
// output, not messages.
func holdsMessage(line []byte) bool {
	t := bytes.TrimLeft(line, " \t\r")
	if len(t) == 0 {
		return false
	}
	switch t[0] {
	case '{':
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
