package federate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
)

// jsonLines is a stdio server's stdout as its session reads it: the lines
// that can hold a message (their first byte other than a space, tab or CR
// is '{' or '['), the others dropped. MCP's stdio transport carries one
// message per line and nothing else, yet servers print banners and debug
// output there; the Go SDK's client ends the session at the first such
// line (failing the calls in flight of every tenant sharing the process),
// where the TypeScript SDK's skips it. skipped is told each dropped line's
// first chunk (up to the buffer's size).
type jsonLines struct {
	br      *bufio.Reader
	skipped func(line []byte)

	rest     []byte // of the current chunk, not yet read (points into br)
	inLine   bool   // the last chunk did not end its line
	dropping bool   // the current line is dropped
	err      error  // the read error, returned once rest is empty
}

func newJSONLines(r interface{ Read([]byte) (int, error) }, skipped func([]byte)) *jsonLines {
	return &jsonLines{br: bufio.NewReaderSize(r, 64<<10), skipped: skipped}
}

func (j *jsonLines) Read(p []byte) (int, error) {
	for len(j.rest) == 0 {
		if j.err != nil {
			return 0, j.err
		}
		// rest is empty: the chunk ReadSlice overwrites has been read.
		chunk, err := j.br.ReadSlice('\n')
		if len(chunk) > 0 {
			if !j.inLine {
				j.dropping = !holdsMessage(chunk)
				if j.dropping {
					j.skipped(chunk)
				}
			}
			j.inLine = chunk[len(chunk)-1] != '\n'
			if !j.dropping {
				j.rest = chunk
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			j.err = err
		}
	}
	n := copy(p, j.rest)
	j.rest = j.rest[n:]
	return n, nil
}

// holdsMessage reports whether a line beginning with chunk can hold a
// JSON-RPC message (or a batch): a whole line must be one.
func holdsMessage(chunk []byte) bool {
	t := bytes.TrimLeft(chunk, " \t\r")
	if len(t) == 0 || (t[0] != '{' && t[0] != '[') {
		return false
	}
	if t[len(t)-1] != '\n' {
		return true // longer than the buffer: judged by its start
	}
	// A whole line: a message only if it is JSON-RPC ("[INFO] ..." and a
	// JSON logger's {"level":30,...} are output, not messages).
	var m struct {
		V string `json:"jsonrpc"`
	}
	if t[0] == '[' {
		var batch []json.RawMessage
		return json.Unmarshal(t, &batch) == nil
	}
	return json.Unmarshal(t, &m) == nil && m.V == "2.0"
}
