package mcp

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// chunkReader hands out data n bytes per Read, then returns end (io.EOF
// when nil), the way a slow client's body arrives.
type chunkReader struct {
	data []byte
	n    int
	end  error
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		if c.end == nil {
			return 0, io.EOF
		}
		return 0, c.end
	}
	k := min(len(p), c.n, len(c.data))
	copy(p, c.data[:k])
	c.data = c.data[k:]
	return k, nil
}

func (c *chunkReader) Close() error { return nil }

func bodyRequest(declared int64, body io.ReadCloser) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	r.Body, r.ContentLength = body, declared
	return r
}

// allocatedBy returns the bytes allocated (by every goroutine: keep the
// test sequential) while f runs.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A client declaring the maximum and sending one byte before it hangs up
// (net/http then reports io.ErrUnexpectedEOF) must cost what it sent, not
// what it declared: ReadBody used to allocate the declared 4 MiB up front.
func TestReadBodyMemoryFollowsBytesReceived(t *testing.T) {
	for _, declared := range []int64{DefaultMaxBody, 1 << 20, -1} {
		var e *Error
		alloc := allocatedBy(func() {
			r := bodyRequest(declared, &chunkReader{data: []byte("{"), n: 1, end: io.ErrUnexpectedEOF})
			_, e = ReadBody(r, DefaultMaxBody)
		})
		if e == nil || e.HTTPStatus != http.StatusBadRequest || e.Code != CodeParseError {
			t.Fatalf("declared %d, 1 byte then a broken connection: %v, want a 400", declared, e)
		}
		if alloc > 4*initialBodyBuffer {
			t.Fatalf("declared %d, received 1 byte: %d bytes allocated, want at most %d", declared, alloc, 4*initialBodyBuffer)
		}
	}
}

// The buffer grows with the data and ends at the bytes sent, whatever was
// declared; one byte past the limit is a 413 however the length was (or was
// not) declared.
func TestReadBodyGrowsWithData(t *testing.T) {
	const max = 300_000
	data := bytes.Repeat([]byte("0123456789abcdef"), max/16) // 300000 bytes: exactly max
	tests := []struct {
		name     string
		declared int64
		data     []byte
		chunk    int
		status   int // 0: accepted
	}{
		{"exact length, small chunks", max, data, 1000, 0},
		{"unknown length", -1, data, 4096, 0},
		{"declared short of the data", 10, data, 7777, 0},
		{"declared past the data", max, data[:1234], 100, 0},
		{"empty, unknown length", -1, nil, 1, 0},
		{"one byte over, unknown length", -1, append(slices.Clip(data), 'x'), 5000, http.StatusRequestEntityTooLarge},
		{"one byte over, declared under the limit", 5, append(slices.Clip(data), 'x'), 65536, http.StatusRequestEntityTooLarge},
		{"declared over the limit", max + 1, data[:1], 1, http.StatusRequestEntityTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, e := ReadBody(bodyRequest(tt.declared, &chunkReader{data: tt.data, n: tt.chunk}), max)
			if tt.status != 0 {
				if e == nil || e.HTTPStatus != tt.status || e.Code != CodeInvalidRequest || !errors.Is(e, ErrBodyTooLarge) {
					t.Fatalf("ReadBody = %d bytes, %v; want %d", len(got), e, tt.status)
				}
				return
			}
			if e != nil || !bytes.Equal(got, tt.data) {
				t.Fatalf("ReadBody = %d bytes, %v; want the %d bytes sent", len(got), e, len(tt.data))
			}
		})
	}

	// http.MaxBytesReader set by a handler in front is a 413 too.
	w := httptest.NewRecorder()
	r := bodyRequest(-1, nil)
	r.Body = http.MaxBytesReader(w, &chunkReader{data: data, n: 512}, 100)
	if _, e := ReadBody(r, max); e == nil || e.HTTPStatus != http.StatusRequestEntityTooLarge {
		t.Fatalf("MaxBytesReader: %v", e)
	}
}

// Reading a declared body whole allocates about its size, not a multiple
// of it (the buffer stops at declared+1 instead of doubling past it).
func TestReadBodyAllocatesAboutTheBody(t *testing.T) {
	const size = 1 << 20
	data := bytes.Repeat([]byte("x"), size)
	var got []byte
	alloc := allocatedBy(func() {
		got, _ = ReadBody(bodyRequest(size, &chunkReader{data: data, n: 32 << 10}), DefaultMaxBody)
	})
	if len(got) != size {
		t.Fatalf("read %d bytes", len(got))
	}
	if alloc > 2*size+4*initialBodyBuffer {
		t.Fatalf("reading %d bytes allocated %d", size, alloc)
	}
}

// Exactly one JSON value and then only JSON whitespace: a NUL byte is not
// the end of the input (peek used to return 0 for both).
func TestScannerNULIsNotEndOfInput(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, body := range []string{
		msg + "\x00" + `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}`,
		msg + "\x00",
		msg + " \x00",
		msg + "\n\x00\n",
		"\x00" + msg,
		msg + "x",
		msg + "\v",
		msg + "\u00a0",
		msg + "\ufeff",
		msg + msg,
	} {
		m, err := Parse([]byte(body))
		var e *Error
		if err == nil || !errors.As(err, &e) || e.Code != CodeParseError {
			t.Errorf("Parse(%q) = %+v, %v; want a parse error", body, m, err)
		}
	}
	if _, err := Parse([]byte(" \t\r\n" + msg + " \t\r\n")); err != nil {
		t.Errorf("JSON whitespace around the message: %v", err)
	}

	for _, v := range []string{"1\x00", `"a"` + "\x00", "null\x00", `{"a":1}` + "\x00", "[]\x00[]"} {
		if jsonscan.Valid([]byte(v)) {
			t.Errorf("Valid(%q) = true", v)
		}
		if _, err := CanonicalArguments([]byte(v)); err == nil {
			t.Errorf("CanonicalArguments(%q) accepted", v)
		}
	}
	// Inside a value a NUL is an unexpected character, not a premature end.
	for _, v := range []string{"{\x00}", "[1\x00]", `{"a":` + "\x00}"} {
		s := jsonscan.New([]byte(v))
		_, err := s.SkipValue()
		if err == nil || strings.Contains(err.Error(), "end of input") {
			t.Errorf("skipValue(%q) = %v, want an unexpected-character error", v, err)
		}
	}
	if _, err := filterList([]byte(`{"tools":[]}`+"\x00"+`{"tools":[{"name":"hidden"}]}`), Filter{List: ToolsList, Allow: func(string) bool { return true }}); err == nil {
		t.Error("filterTools accepted a result followed by a NUL and a second object")
	}
}

// Batches are refused with the documented message, whatever the protocol.
func TestParseBatchRefused(t *testing.T) {
	for _, body := range []string{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, ` [ ]`, "\n[{},{}]"} {
		_, err := Parse([]byte(body))
		var e *Error
		if !errors.As(err, &e) || e.HTTPStatus != 400 || e.Code != CodeInvalidRequest || !errors.Is(err, ErrBatch) ||
			e.Message != "JSON-RPC batches are not supported: MCP 2025-06-18 removed them; send one message per request" {
			t.Errorf("Parse(%s) = %v", body, err)
		}
	}
}

// requestFor is a minimal valid request for method.
func requestFor(method string) string {
	params := ""
	switch method {
	case MethodToolsCall, MethodPromptsGet:
		params = `,"params":{"name":"n"}`
	case MethodResourcesRead, MethodResourcesSubscribe, MethodResourcesUnsubscribe:
		params = `,"params":{"uri":"file:///a"}`
	}
	return `{"jsonrpc":"2.0","id":"r1","method":` + string(jsonscan.AppendString(nil, method)) + params + `}`
}

func TestParseMethodNamesExact(t *testing.T) {
	for _, method := range append(KnownMethods(), "x/custom", "tools/callx", "tool/call", "ÄÖ/ü", "notifications/custom") {
		if _, err := Parse([]byte(requestFor(method))); err != nil {
			t.Errorf("method %q refused: %v", method, err)
		}
	}
	for _, method := range []string{
		"Tools/call", "tools/Call", "TOOLS/CALL", "TOOLS/LIST", "resources/Read", "Initialize", "PING",
		"notifications/Initialized", "prompts/GET", "tools/li\u017Ft", // ſ folds to s
		"tools/call ", " tools/call", " initialize", "tools/call\t", "\ntools/list", "tools/call\u00a0", "\ufefftools/call",
		"tools/call\u0000", "tools\u0000/call", "\u0000", "tools/call\u007f", "tools/call\u0085", "x\u0001y",
		"tools/call" + strings.Repeat(" ", 10000),
		"", // no method is named so, and a governed empty name could be counted as another method
	} {
		_, err := Parse([]byte(requestFor(method)))
		var e *Error
		if !errors.As(err, &e) || e.HTTPStatus != 400 || e.Code != CodeInvalidRequest || !errors.Is(err, ErrMethodNotExact) ||
			string(e.ID) != `"r1"` || !strings.Contains(e.Message, "not exact") {
			t.Errorf("method %q: %v", method, err)
			continue
		}
		if len(e.Message) > 200 {
			t.Errorf("method %q: message of %d bytes echoes the name", method, len(e.Message))
		}
	}
	// Escapes decode before the comparison: the upstream decodes them too.
	if m, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools\/c\u0061ll","params":{"name":"n"}}`)); err != nil || m.Method != MethodToolsCall {
		t.Errorf("escaped exact name: %v", err)
	}
	if _, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools\/C\u0061ll","params":{"name":"n"}}`)); !errors.Is(err, ErrMethodNotExact) {
		t.Errorf("escaped case variant: %v", err)
	}
}

func TestKnownMethods(t *testing.T) {
	got := KnownMethods()
	for _, want := range []string{
		"initialize", "ping", "tools/list", "tools/call", "resources/read", "resources/templates/list",
		"prompts/get", "completion/complete", "logging/setLevel", "sampling/createMessage", "elicitation/create",
		"roots/list", "server/discover", "subscriptions/listen", "tasks/get",
		"notifications/initialized", "notifications/cancelled", "notifications/progress",
		"notifications/subscriptions/acknowledged", "notifications/elicitation/complete",
	} {
		if !slices.Contains(got, want) || !IsKnownMethod(want) {
			t.Errorf("%q missing", want)
		}
	}
	seen := map[string]bool{}
	for _, m := range got {
		folded := strings.ToLower(m)
		if seen[folded] || inexactMethod(m) != "" {
			t.Errorf("%q duplicated or not exact", m)
		}
		seen[folded] = true
	}
	got[0] = "changed"
	if KnownMethods()[0] == "changed" || IsKnownMethod("changed") {
		t.Error("KnownMethods shares its slice")
	}
	if IsKnownMethod("Tools/call") || IsKnownMethod("tools/call ") {
		t.Error("IsKnownMethod is not exact")
	}
}

func TestCheckRequestHeaders(t *testing.T) {
	long := strings.Repeat("v", 5000)
	tests := []struct {
		name   string
		header http.Header
		names  string // the header the error must name, "" for ok
	}{
		{"none", http.Header{}, ""},
		{"one of each", http.Header{"Mcp-Session-Id": {"s.mac"}, "Mcp-Protocol-Version": {"2025-06-18"},
			"Authorization": {"Bearer t"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo"}, "Last-Event-Id": {"e1"},
			"Accept": {"a", "b"}, "X-Other": {""}}, ""},
		{"surrounding whitespace kept", http.Header{"Mcp-Session-Id": {" s.mac\t"}}, ""},
		{"non-ASCII is not a control", http.Header{"Mcp-Name": {"caf\u00e9"}}, ""},
		{"duplicate session", http.Header{"Mcp-Session-Id": {"a", "a"}}, "Mcp-Session-Id"},
		{"empty first session", http.Header{"Mcp-Session-Id": {"", "s.mac"}}, "Mcp-Session-Id"},
		{"empty session", http.Header{"Mcp-Session-Id": {""}}, "Mcp-Session-Id"},
		{"blank session", http.Header{"Mcp-Session-Id": {" \t "}}, "Mcp-Session-Id"},
		{"non-canonical twin", http.Header{"Mcp-Session-Id": {"a"}, "mcp-session-id": {"b"}}, "Mcp-Session-Id"},
		{"non-canonical empty", http.Header{"MCP-SESSION-ID": {""}}, "Mcp-Session-Id"},
		{"duplicate version", http.Header{"Mcp-Protocol-Version": {"2025-06-18", "2025-11-25"}}, "Mcp-Protocol-Version"},
		{"duplicate authorization", http.Header{"Authorization": {"Bearer a", "Bearer b"}}, "Authorization"},
		{"empty authorization", http.Header{"Authorization": {""}}, "Authorization"},
		{"empty method", http.Header{"Mcp-Method": {""}}, "Mcp-Method"},
		{"duplicate name", http.Header{"Mcp-Name": {"echo", "echo"}}, "Mcp-Name"},
		{"empty last event", http.Header{"Last-Event-Id": {""}}, "Last-Event-Id"},
		{"tab inside", http.Header{"Mcp-Session-Id": {"a\tb"}}, "Mcp-Session-Id"},
		{"NUL", http.Header{"Mcp-Method": {"tools/call\x00"}}, "Mcp-Method"},
		{"DEL", http.Header{"Last-Event-Id": {"1\x7f"}}, "Last-Event-Id"},
		{"newline", http.Header{"Mcp-Name": {"a\nb"}}, "Mcp-Name"},
		{"control in a long value", http.Header{"Mcp-Name": {long + "\x01"}}, "Mcp-Name"},
		{"first problem in order", http.Header{"Last-Event-Id": {""}, "Mcp-Session-Id": {"a", "b"}}, "Mcp-Session-Id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := CheckRequestHeaders(tt.header)
			if tt.names == "" {
				if e != nil {
					t.Fatalf("refused: %v", e)
				}
				return
			}
			if e == nil || e.HTTPStatus != 400 || e.Code != CodeInvalidRequest || e.ID != nil || !errors.Is(e, ErrBadHeader) ||
				!strings.HasPrefix(e.Message, "header "+tt.names+" ") {
				t.Fatalf("CheckRequestHeaders = %v, want a 400 naming %s", e, tt.names)
			}
			if len(e.Message) > 200 {
				t.Fatalf("message of %d bytes", len(e.Message))
			}
		})
	}
	// A credential is never repeated back.
	e := CheckRequestHeaders(http.Header{"Authorization": {"Bearer secret-token\x01"}})
	if e == nil || strings.Contains(e.Message, "secret") {
		t.Fatalf("authorization: %v", e)
	}
	// Written on the wire, the error is a JSON-RPC error response.
	rec := httptest.NewRecorder()
	CheckRequestHeaders(http.Header{"Mcp-Name": {"a", "b"}}).Respond(rec)
	if m, err := Parse(rec.Body.Bytes()); rec.Code != 400 || err != nil || m.Kind != Response || string(m.ID) != "null" {
		t.Fatalf("response %d %s: %v", rec.Code, rec.Body, err)
	}
}

func TestQuoteCapped(t *testing.T) {
	for _, s := range []string{"", "abc", strings.Repeat("a", 62), strings.Repeat("a", 63), strings.Repeat("a", 5000),
		strings.Repeat("\xf6", 64), strings.Repeat("\u00e9", 100), strings.Repeat("\U0010FFFF", 40), "\x00\x01\x02" + strings.Repeat("\ufeff", 30)} {
		q := quoteCapped(s)
		if len(q) > maxQuoted+len("...") {
			t.Errorf("quoteCapped(%d bytes) = %d bytes", len(s), len(q))
		}
		if full := strconv.Quote(s); len(full) <= maxQuoted && q != full {
			t.Errorf("quoteCapped(%q) = %s, want %s", s, q, full)
		}
		if unq, err := strconv.Unquote(strings.TrimSuffix(q, "...")); err != nil || !strings.HasPrefix(s, unq) {
			t.Errorf("quoteCapped(%q) = %s: not a quoted prefix (%v)", s, q, err)
		}
	}
}

// Subscriptions carry their resource in Name (scopes apply to them), and a
// task-augmented tools/call is refused: its slot, cost and outcome could
// not be governed.
func TestParseSubscriptionsAndTasks(t *testing.T) {
	for _, method := range []string{"resources/subscribe", "resources/unsubscribe"} {
		m, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"` + method + `","params":{"uri":"file:///a"}}`))
		if err != nil || m.Name != "file:///a" {
			t.Errorf("%s: %v, name %q", method, err, m.Name)
		}
	}
	_, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","task":{"ttl":1000}}}`))
	var e *Error
	if !errors.As(err, &e) || e.HTTPStatus != 400 || e.Code != CodeInvalidParams || !strings.Contains(e.Message, "task-augmented") {
		t.Errorf("task-augmented call: %v", err)
	}
	if _, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","task":null}}`)); err != nil {
		t.Errorf("task: null refused: %v", err)
	}
}
