package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"testing"
)

// FuzzParse: Parse never panics; what it refuses gets a well-formed JSON-RPC
// error; what it accepts is valid JSON, re-encodes to a message Parse
// accepts with the same envelope, and agrees with encoding/json on the
// method and tool name (no parser differential).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`,
		`{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{"cursor":"x"}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","NAME":"b"}}`,
		`{"jsonrpc":"2.0","id":1e0,"method":"tools/call","params":{"name":"\ud83d\ude00"}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","params":[1,{"a":[true,false,null]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := Parse(body)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || m != nil {
				t.Fatalf("Parse error %T %v with message %v", err, err, m)
			}
			if e.HTTPStatus != 400 || (e.Code != CodeParseError && e.Code != CodeInvalidRequest && e.Code != CodeInvalidParams) {
				t.Fatalf("unexpected error %+v", e)
			}
			rec := httptest.NewRecorder()
			e.Respond(rec)
			if r, err := Parse(rec.Body.Bytes()); err != nil || r.Kind != Response || r.Error == nil {
				t.Fatalf("error response %s is not a JSON-RPC error: %v", rec.Body, err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if m.Kind != Request && m.Kind != Notification && m.Kind != Response {
			t.Fatalf("kind %v", m.Kind)
		}

		enc, err := json.Marshal(m)
		if err != nil || !json.Valid(enc) {
			t.Fatalf("re-encoding %q: %q %v", body, enc, err)
		}
		m2, err := Parse(enc)
		if err != nil {
			t.Fatalf("re-encoded %q is refused: %v", enc, err)
		}
		if m2.Kind != m.Kind || m2.Method != m.Method || m2.ToolName != m.ToolName || m2.Name != m.Name ||
			!bytes.Equal(m2.ID, m.ID) || !bytes.Equal(m2.Arguments, m.Arguments) || !bytes.Equal(m2.Params, m.Params) ||
			!bytes.Equal(m2.Result, m.Result) || !bytes.Equal(m2.Error, m.Error) {
			t.Fatalf("round trip changed the envelope:\n%+v\n%+v", m, m2)
		}

		// encoding/json, matching map keys exactly, must read the same.
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("encoding/json refuses accepted %q: %v", body, err)
		}
		if m.Kind != Response {
			var method string
			if err := json.Unmarshal(top["method"], &method); err != nil || method != m.Method {
				t.Fatalf("method %q, encoding/json says %q (%v)", m.Method, method, err)
			}
		}
		if m.Kind == Notification && top["id"] != nil {
			t.Fatalf("notification with an id")
		}
		if m.ToolName != "" {
			var params struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(top["params"], &params); err != nil || params.Name != m.ToolName {
				t.Fatalf("tool %q, encoding/json says %q (%v)", m.ToolName, params.Name, err)
			}
			if m.Arguments != nil && m.Arguments[0] != '{' && string(m.Arguments) != "null" {
				t.Fatalf("arguments %q", m.Arguments)
			}
		}
	})
}
