package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseValid(t *testing.T) {
	tests := []struct {
		name, body string
		want       Message
	}{
		{"tools/call", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{"q":"x"}}}`,
			Message{ID: json.RawMessage(`7`), Method: "tools/call", ToolName: "search", Name: "search", Arguments: json.RawMessage(`{"q":"x"}`), Kind: Request}},
		{"string id and whitespace", " \n{ \"id\" : \"a-1\" , \"method\":\"tools/list\",\"jsonrpc\":\"2.0\"}\n",
			Message{ID: json.RawMessage(`"a-1"`), Method: "tools/list", Kind: Request}},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			Message{Method: "notifications/initialized", Kind: Notification}},
		{"result response", `{"jsonrpc":"2.0","id":3,"result":{}}`,
			Message{ID: json.RawMessage(`3`), Kind: Response, Result: json.RawMessage(`{}`)}},
		{"error response with null id", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}`,
			Message{ID: json.RawMessage(`null`), Kind: Response, Error: json.RawMessage(`{"code":-32700,"message":"x"}`)}},
		{"escaped tool name", `{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"s\u0065arch"}}`,
			Message{ID: json.RawMessage(`1`), Method: "tools/call", ToolName: "search", Name: "search", Kind: Request}},
		{"null arguments", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":null}}`,
			Message{ID: json.RawMessage(`1`), Method: "tools/call", ToolName: "echo", Name: "echo", Arguments: json.RawMessage(`null`), Kind: Request}},
		{"integral id written as float", `{"jsonrpc":"2.0","id":1.0,"method":"ping"}`,
			Message{ID: json.RawMessage(`1.0`), Method: "ping", Kind: Request}},
		{"unknown members ignored", `{"jsonrpc":"2.0","id":1,"method":"ping","extra":{"method":"x"}}`,
			Message{ID: json.RawMessage(`1`), Method: "ping", Kind: Request}},
		{"prompts/get name", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p"}}`,
			Message{ID: json.RawMessage(`1`), Method: "prompts/get", Name: "p", Kind: Request}},
		{"resources/read uri", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}`,
			Message{ID: json.RawMessage(`1`), Method: "resources/read", Name: "file:///a", Kind: Request}},
		{"arguments with lone surrogate", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"\ud83d"}}}`,
			Message{ID: json.RawMessage(`1`), Method: "tools/call", ToolName: "echo", Name: "echo", Arguments: json.RawMessage(`{"text":"\ud83d"}`), Kind: Request}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse([]byte(tt.body))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := *m
			got.Params = nil // checked separately
			if !bytes.Equal(got.ID, tt.want.ID) || got.Method != tt.want.Method || got.ToolName != tt.want.ToolName ||
				got.Name != tt.want.Name || !bytes.Equal(got.Arguments, tt.want.Arguments) || got.Kind != tt.want.Kind ||
				!bytes.Equal(got.Result, tt.want.Result) || !bytes.Equal(got.Error, tt.want.Error) {
				t.Fatalf("Parse = %+v\nwant    %+v", got, tt.want)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name, body string
		code       int
		id         string // expected id in the error, "" for none
	}{
		{"empty", ``, CodeParseError, ""},
		{"whitespace", " \n", CodeParseError, ""},
		{"not json", `{"jsonrpc":"2.0",`, CodeParseError, ""},
		{"trailing data", `{"jsonrpc":"2.0","method":"x"} {}`, CodeParseError, ""},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, CodeInvalidRequest, ""},
		{"empty batch", `[]`, CodeInvalidRequest, ""},
		{"invalid batch", `[{]`, CodeParseError, ""},
		{"scalar", `42`, CodeInvalidRequest, ""},
		{"wrong version", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, CodeInvalidRequest, "1"},
		{"missing version", `{"id":1,"method":"ping"}`, CodeInvalidRequest, "1"},
		{"numeric version", `{"jsonrpc":2.0,"id":1,"method":"ping"}`, CodeInvalidRequest, "1"},
		{"method not a string", `{"jsonrpc":"2.0","id":1,"method":5}`, CodeInvalidRequest, "1"},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"ping"}`, CodeInvalidRequest, ""},
		{"bool id", `{"jsonrpc":"2.0","id":true,"method":"ping"}`, CodeInvalidRequest, ""},
		// requests sent without an id: no upstream runs them, the gateway would govern them
		{"tools/call without id", `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}`, CodeInvalidRequest, ""},
		{"ping without id", `{"jsonrpc":"2.0","method":"ping"}`, CodeInvalidRequest, ""},
		// an SDK truncating 7.5 would cancel call 7, which the gateway matched to no call
		{"fractional requestId", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7.5}}`, CodeInvalidParams, ""},
		{"object requestId", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{}}}`, CodeInvalidParams, ""},
		{"fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, CodeInvalidRequest, ""},
		{"huge id", `{"jsonrpc":"2.0","id":9007199254740992,"method":"ping"}`, CodeInvalidRequest, ""},
		{"null id request", `{"jsonrpc":"2.0","id":null,"method":"ping"}`, CodeInvalidRequest, "null"},
		{"null id result", `{"jsonrpc":"2.0","id":null,"result":{}}`, CodeInvalidRequest, "null"},
		{"no method no id", `{"jsonrpc":"2.0"}`, CodeInvalidRequest, ""},
		{"response without result", `{"jsonrpc":"2.0","id":1}`, CodeInvalidRequest, "1"},
		{"result and error", `{"jsonrpc":"2.0","id":1,"result":1,"error":{}}`, CodeInvalidRequest, "1"},
		{"error not object", `{"jsonrpc":"2.0","id":1,"error":"bad"}`, CodeInvalidRequest, "1"},
		{"request with result", `{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}`, CodeInvalidRequest, "1"},
		{"params scalar", `{"jsonrpc":"2.0","id":1,"method":"ping","params":3}`, CodeInvalidRequest, "1"},
		{"duplicate method", `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}`, CodeInvalidRequest, "1"},
		{"case twin method", `{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call"}`, CodeInvalidRequest, "1"},
		{"folded twin jsonrpc", `{"jsonrpc":"2.0","id":1,"method":"ping","j\u017Fonrpc":"2.0"}`, CodeInvalidRequest, "1"},
		{"duplicate id", `{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}`, CodeInvalidRequest, "1"},
		{"call without params", `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, CodeInvalidParams, "1"},
		{"call params array", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["echo"]}`, CodeInvalidParams, "1"},
		{"call without name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`, CodeInvalidParams, "1"},
		{"call name not string", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":1}}`, CodeInvalidParams, "1"},
		{"call empty name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":""}}`, CodeInvalidParams, "1"},
		{"call duplicate name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"admin"}}`, CodeInvalidParams, "1"},
		{"call case twin name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","NAME":"admin"}}`, CodeInvalidParams, "1"},
		{"call arguments array", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":[1]}}`, CodeInvalidParams, "1"},
		{"call lone surrogate name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a\udc00"}}`, CodeInvalidParams, "1"},
		{"raw invalid utf8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\xffing\"}", CodeParseError, ""},
		{"raw control char", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\ting\"}", CodeParseError, ""},
		{"too deep", `{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}}`, CodeParseError, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse([]byte(tt.body))
			if err == nil {
				t.Fatalf("Parse accepted %s: %+v", tt.body, m)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *Error", err)
			}
			if e.Code != tt.code || e.HTTPStatus != http.StatusBadRequest {
				t.Fatalf("code %d status %d (%s), want code %d status 400", e.Code, e.HTTPStatus, e.Message, tt.code)
			}
			if string(e.ID) != tt.id {
				t.Fatalf("error id %q, want %q", e.ID, tt.id)
			}
		})
	}
}

func TestParseDepthLimitBoundary(t *testing.T) {
	// MaxDepth levels in total (the message object is one) are fine.
	inner := strings.Repeat("[", MaxDepth-2) + strings.Repeat("]", MaxDepth-2)
	body := `{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":` + inner + `}}`
	if _, err := Parse([]byte(body)); err != nil {
		t.Fatalf("depth %d refused: %v", MaxDepth, err)
	}
}

func TestSameID(t *testing.T) {
	same := [][2]string{{`1`, `1`}, {`1`, `1.0`}, {`10`, `1e1`}, {`"a"`, `"\u0061"`}, {`-3`, `-3.00`}}
	differ := [][2]string{{`1`, `"1"`}, {`1`, `2`}, {`"a"`, `"A"`}, {`null`, `null`}, {``, `1`}}
	for _, p := range same {
		if !SameID(json.RawMessage(p[0]), json.RawMessage(p[1])) {
			t.Errorf("SameID(%s, %s) = false", p[0], p[1])
		}
	}
	for _, p := range differ {
		if SameID(json.RawMessage(p[0]), json.RawMessage(p[1])) {
			t.Errorf("SameID(%s, %s) = true", p[0], p[1])
		}
	}
}

// WithID replaces a request's id and nothing else (a sub-slice body
// included: the id is found in it, not in what follows it), and the Message
// it returns is the copy's; a message that is no request is refused.
func TestWithID(t *testing.T) {
	const id = `"mcpgate-load-1"`
	for _, c := range []struct{ body, want string }{
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{"id":7},"_meta":{"progressToken":7}}}`,
			`{"jsonrpc":"2.0","id":"mcpgate-load-1","method":"tools/call","params":{"name":"slow","arguments":{"id":7},"_meta":{"progressToken":7}}}`},
		{` { "method" : "tools/call", "params":{"name":"a"}, "id" : "x\u0041", "jsonrpc":"2.0", "extra":1 } `,
			` { "method" : "tools/call", "params":{"name":"a"}, "id" : "mcpgate-load-1", "jsonrpc":"2.0", "extra":1 } `},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`, ""},
		{`{"jsonrpc":"2.0","id":2,"result":{}}`, ""},
		{`{"jsonrpc":"2.0","id":2,"id":3,"method":"ping"}`, ""},
		{`[1]`, ""},
	} {
		buf := []byte("[" + c.body + `,{"id":99}]`)
		body := buf[1 : 1+len(c.body)] // its capacity runs past its end
		got, m, err := WithID(body, json.RawMessage(id))
		if c.want == "" {
			if err == nil {
				t.Errorf("WithID(%s) = %s, want an error", c.body, got)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("WithID(%s) = %s, %v\nwant %s", c.body, got, err, c.want)
			continue
		}
		if string(m.ID) != id || m.Method != MethodToolsCall || !bytes.Contains(got, m.Params) {
			t.Errorf("WithID(%s): message %+v", c.body, m)
		}
		if string(body) != c.body {
			t.Errorf("WithID changed its input: %s", body)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`,
		`{"jsonrpc":"2.0","id":2,"result":{"tools":[]}}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}}`,
	} {
		m, err := Parse([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(m)
		if string(b) != body {
			t.Errorf("Marshal = %s\nwant      %s", b, body)
		}
	}
}

func TestReadBody(t *testing.T) {
	req := func(body string, contentLength int64) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		r.ContentLength = contentLength
		return r
	}
	b, e := ReadBody(req("hello", 5), 5)
	if e != nil || string(b) != "hello" {
		t.Fatalf("at limit: %q %v", b, e)
	}
	if _, e := ReadBody(req("hello!", -1), 5); e == nil || e.HTTPStatus != http.StatusRequestEntityTooLarge {
		t.Fatalf("over limit, unknown length: %v", e)
	}
	// A declared length over the limit is refused without reading the body.
	r := req("x", 1000)
	r.Body = readerFunc(func([]byte) (int, error) { t.Fatal("body read"); return 0, nil })
	if _, e := ReadBody(r, 10); e == nil || e.HTTPStatus != http.StatusRequestEntityTooLarge || e.Code != CodeInvalidRequest {
		t.Fatalf("declared over limit: %v", e)
	}
	r = req("", 0)
	r.Body = readerFunc(func([]byte) (int, error) { return 0, errors.New("connection reset") })
	r.ContentLength = -1
	if _, e := ReadBody(r, 10); e == nil || e.HTTPStatus != http.StatusBadRequest {
		t.Fatalf("read error: %v", e)
	}
	if b, e := ReadBody(req("abc", 3), 0); e != nil || string(b) != "abc" {
		t.Fatalf("default limit: %q %v", b, e)
	}
	// The largest limit and a declared length equal to it: no length+1
	// may wrap to a negative buffer size (it panicked in make).
	if b, e := ReadBody(req("abc", math.MaxInt64), math.MaxInt64); e != nil || string(b) != "abc" {
		t.Fatalf("limit and declared length at MaxInt64: %q %v", b, e)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
func (f readerFunc) Close() error               { return nil }

func TestCheckHeaders(t *testing.T) {
	call, err := Parse([]byte(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo"}}`))
	if err != nil {
		t.Fatal(err)
	}
	list, _ := Parse([]byte(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	tests := []struct {
		name    string
		m       *Message
		headers map[string][]string
		ok      bool
	}{
		{"no headers", call, nil, true},
		{"matching", call, map[string][]string{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo"}}, true},
		{"method only", list, map[string][]string{"Mcp-Method": {"tools/list"}}, true},
		{"method mismatch", call, map[string][]string{"Mcp-Method": {"tools/list"}}, false},
		{"name mismatch", call, map[string][]string{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"admin"}}, false},
		{"second value lies", call, map[string][]string{"Mcp-Name": {"echo", "admin"}}, false},
		{"empty value", call, map[string][]string{"Mcp-Method": {""}}, false},
		{"name on a list", list, map[string][]string{"Mcp-Name": {"echo"}}, false},
		{"case differs", call, map[string][]string{"Mcp-Name": {"Echo"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			for k, v := range tt.headers {
				for _, x := range v {
					r.Header.Add(k, x)
				}
			}
			e := CheckHeaders(r, tt.m)
			if tt.ok != (e == nil) {
				t.Fatalf("CheckHeaders = %v, want ok=%v", e, tt.ok)
			}
			if e != nil && (e.Code != CodeHeaderMismatch || e.HTTPStatus != 400 || string(e.ID) != "9") {
				t.Fatalf("error %+v", e)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Retry-After", "3")
	WriteError(rec, http.StatusTooManyRequests, json.RawMessage(`"req-1"`), CodeRateLimited, "rate limited",
		map[string]any{"scope": "tenant", "retry_after_seconds": 3})
	if rec.Code != 429 || rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("Retry-After") != "3" {
		t.Fatalf("status %d headers %v", rec.Code, rec.Header())
	}
	want := `{"jsonrpc":"2.0","id":"req-1","error":{"code":-33029,"message":"rate limited","data":{"retry_after_seconds":3,"scope":"tenant"}}}`
	if rec.Body.String() != want {
		t.Fatalf("body %s\nwant %s", rec.Body, want)
	}
	m, err := Parse(rec.Body.Bytes())
	if err != nil || m.Kind != Response {
		t.Fatalf("error body is not a valid response: %v", err)
	}

	rec = httptest.NewRecorder()
	WriteError(rec, 400, nil, CodeParseError, "bad", func() {}) // unencodable data is dropped
	if rec.Body.String() != `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}` {
		t.Fatalf("body %s", rec.Body)
	}
	rec = httptest.NewRecorder()
	(&Error{HTTPStatus: 413, Code: CodeInvalidRequest, Message: "big", ID: json.RawMessage(`{bad`)}).Respond(rec)
	if rec.Code != 413 || !strings.Contains(rec.Body.String(), `"id":null`) {
		t.Fatalf("Respond with invalid id: %d %s", rec.Code, rec.Body)
	}
}
