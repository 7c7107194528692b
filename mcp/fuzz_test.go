package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
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
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\x00{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}",
		`{"jsonrpc":"2.0","id":1,"method":"Tools/call","params":{"name":"echo"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call\u0000","params":{"name":"echo"}}`,
		`{"jsonrpc":"2.0","id":1,"method":" initialize"}`,
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["file:///a","x"]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["a"],"resourcesubscriptions":["b"]}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999,"RequestId":7}}`,
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

		// MarshalJSON's own bytes: json.Marshal would HTML-escape them
		// (& becomes \u0026), changing the raw params it compares.
		enc, err := m.MarshalJSON()
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
			assertExactMethod(t, m.Method)
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
		if m.Method == MethodSubscriptionsListen {
			checkListen(t, m)
		}
		if m.Method == MethodCancelled {
			// The request id the gateway cancels is the one a strict
			// upstream reads (the gateway forwards the message as it is).
			var params map[string]json.RawMessage
			_ = json.Unmarshal(m.Params, &params)
			if !bytes.Equal(params["requestId"], m.CancelID) {
				t.Fatalf("cancels %s, encoding/json (exact keys) reads %s", m.CancelID, params["requestId"])
			}
		}
	})
}

// checkListen holds ListenResources to encoding/json matching keys
// exactly: what it accepts, a strict upstream reads the same.
func checkListen(t *testing.T, m *Message) {
	t.Helper()
	uris, e := ListenResources(m)
	if e != nil {
		if e.HTTPStatus != 400 || e.Code != CodeInvalidParams {
			t.Fatalf("ListenResources error %+v", e)
		}
		return
	}
	// absent reads as null: nothing asked
	object := func(raw json.RawMessage) (map[string]json.RawMessage, bool) {
		var o map[string]json.RawMessage
		if len(raw) == 0 || string(raw) == "null" {
			return nil, true
		}
		return o, json.Unmarshal(raw, &o) == nil
	}
	params, ok1 := object(m.Params)
	n, ok2 := object(params["notifications"])
	var want []string
	ok3 := len(n["resourceSubscriptions"]) == 0 || json.Unmarshal(n["resourceSubscriptions"], &want) == nil
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("ListenResources accepted %s, which encoding/json cannot read", m.Params)
	}
	for _, u := range uris {
		if !utf8.ValidString(u) {
			return // encoding/json would have replaced its invalid bytes
		}
	}
	if !slices.Equal(uris, want) {
		t.Fatalf("ListenResources(%s) = %q, encoding/json reads %q", m.Params, uris, want)
	}
}

// assertExactMethod fails unless an accepted method name is exact: no
// surrounding space, no control character, and no case-folded twin of a
// known method.
func assertExactMethod(t *testing.T, method string) {
	t.Helper()
	if strings.TrimSpace(method) != method || strings.IndexFunc(method, unicode.IsControl) >= 0 {
		t.Fatalf("accepted method %q with whitespace or a control character", method)
	}
	for _, k := range KnownMethods() {
		if strings.EqualFold(method, k) && method != k {
			t.Fatalf("accepted method %q, a case variant of %q", method, k)
		}
	}
}

// FuzzReadBody: for any body, declared Content-Length, limit, chunking and
// ending, ReadBody never panics and returns exactly the bytes sent, or a 413
// when the declared or actual size is over the limit, or a 400 when the
// read failed; never anything else.
func FuzzReadBody(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`), int64(40), int64(0), uint16(7), false)
	f.Add([]byte("x"), int64(DefaultMaxBody), int64(0), uint16(1), true)
	f.Add([]byte("hello!"), int64(-1), int64(5), uint16(2), false)
	f.Add([]byte("hello"), int64(1), int64(5), uint16(100), false)
	f.Add([]byte(""), int64(0), int64(1), uint16(0), false)
	// a small declared length starts a small buffer: growth is exercised
	// without bodies so large that minimising them takes the fuzzer's time
	f.Add(bytes.Repeat([]byte("ab"), 3000), int64(7), int64(6000), uint16(333), false)
	f.Add(bytes.Repeat([]byte("ab"), 3000), int64(6000), int64(5999), uint16(64), false)
	f.Fuzz(func(t *testing.T, body []byte, declared, maxBytes int64, chunk uint16, broken bool) {
		if declared < -1 {
			declared = -1 // net/http's "unknown"
		}
		end := error(nil)
		if broken {
			end = io.ErrUnexpectedEOF
		}
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Body = &chunkReader{data: body, n: max(int(chunk), 1), end: end}
		r.ContentLength = declared
		got, e := ReadBody(r, maxBytes)

		limit := maxBytes
		if limit <= 0 {
			limit = DefaultMaxBody
		}
		over := declared > limit || int64(len(body)) > limit
		switch {
		case over:
			if e == nil || e.HTTPStatus != http.StatusRequestEntityTooLarge || !errors.Is(e, ErrBodyTooLarge) {
				t.Fatalf("%d bytes, declared %d, limit %d: %d bytes, %v; want 413", len(body), declared, limit, len(got), e)
			}
		case broken:
			if e == nil || e.HTTPStatus != http.StatusBadRequest || e.Code != CodeParseError {
				t.Fatalf("broken read: %d bytes, %v; want 400", len(got), e)
			}
		case e != nil:
			t.Fatalf("%d bytes, declared %d, limit %d: %v", len(body), declared, limit, e)
		case !bytes.Equal(got, body):
			t.Fatalf("read %q, sent %q", got, body)
		}
		if e != nil && got != nil {
			t.Fatalf("error %v with %d bytes", e, len(got))
		}
	})
}

// FuzzCheckRequestHeaders: for any two header fields (name and value, added
// with the canonical key or a raw one), CheckRequestHeaders never panics,
// refuses exactly when an interpreted header is repeated, blank or holds a
// control character, names that header, and never quotes more than a short
// prefix of a value, nor an Authorization value at all.
func FuzzCheckRequestHeaders(f *testing.F) {
	f.Add("Mcp-Session-Id", "", "Mcp-Session-Id", "abc.mac", false)
	f.Add("mcp-session-id", "a", "Mcp-Session-Id", "b", true)
	f.Add("Authorization", "Bearer a", "authorization", "Bearer b", false)
	f.Add("Mcp-Method", " ", "Accept", "x", false)
	f.Add("Last-Event-ID", "1\t2", "Mcp-Name", "echo", false)
	f.Add("Mcp-Name", "tools\x00", "X-Other", "", true)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, raw bool) {
		h := http.Header{}
		add := func(k, v string) {
			if raw {
				h[k] = append(h[k], v) // as a handler in front might leave it
			} else {
				h.Add(k, v)
			}
		}
		add(k1, v1)
		add(k2, v2)
		e := CheckRequestHeaders(h)

		// Oracle: group values by canonical name, as net/http would.
		byName := map[string][]string{}
		for k, vs := range h {
			byName[http.CanonicalHeaderKey(k)] = append(byName[http.CanonicalHeaderKey(k)], vs...)
		}
		var bad []string
		for _, name := range interpretedHeaders {
			vs := byName[name]
			if len(vs) > 1 {
				bad = append(bad, name)
				continue
			}
			if len(vs) == 1 {
				v := strings.Trim(vs[0], " \t")
				if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
					bad = append(bad, name)
				}
			}
		}
		if (e == nil) != (len(bad) == 0) {
			t.Fatalf("headers %q: CheckRequestHeaders = %v, problems in %v", h, e, bad)
		}
		if e == nil {
			return
		}
		if e.HTTPStatus != 400 || e.Code != CodeInvalidRequest || e.ID != nil || !strings.HasPrefix(e.Message, "header "+bad[0]+" ") {
			t.Fatalf("headers %q: %+v, want a 400 naming %s", h, e, bad[0])
		}
		if len(e.Message) > 200 {
			t.Fatalf("message of %d bytes", len(e.Message))
		}
		if bad[0] == "Authorization" && strings.Contains(e.Message, `"`) {
			t.Fatalf("authorization value quoted: %s", e.Message)
		}
	})
}
