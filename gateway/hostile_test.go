package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/mcp"
)

// hostileCase is one request that tries to make the gateway read something
// other than what the upstream would read. TestHostileInputs sends it as raw
// HTTP/1.1 bytes (so repeated, empty and odd header lines arrive exactly as
// written) to a real gateway in front of a real go-sdk upstream, and checks
// the status, the JSON-RPC error code and that no request reached the
// upstream. To add a case, append a row to hostileCases.
//
// The request starts from the headers a Streamable HTTP client sends on a
// live session: Content-Type: application/json, Accept: application/json,
// text/event-stream, Mcp-Protocol-Version: 2025-06-18, Authorization:
// Bearer {{token}} and Mcp-Session-Id: {{session}}. A key in header replaces
// that default (canonical spelling), its values written in order, one field
// line each; a key with no values drops the default.
type hostileCase struct {
	name string
	// method is the HTTP method; "" means POST.
	method string
	// header overrides the defaults above. In values, {{token}} is a valid
	// token of the caller (tenant acme), {{other-token}} one of another
	// tenant, and {{session}} the caller's own session id as the gateway
	// issued it.
	header http.Header
	// body is sent as is (after the same {{...}} substitution). Content-Length
	// is its length unless declared is set; a GET or DELETE with an empty
	// body sends no Content-Length.
	body string
	// declared, when non-zero, is the Content-Length sent instead of
	// len(body): the body then ends early, and the gateway must answer
	// without waiting for bytes that never come.
	declared int64
	// status is the HTTP status wanted, code the JSON-RPC error code wanted
	// in the body (0: none required).
	status, code int
	// message, when set, must appear in the JSON-RPC error message.
	message string
	// forwarded marks a control row: the request must reach the upstream
	// exactly once. Every other row must leave the upstream's count as it was.
	forwarded bool
}

const (
	hostileList = `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	hostileCall = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`
)

// hostileCases are the rows of TestHostileInputs.
func hostileCases() []hostileCase {
	bad := http.StatusBadRequest
	invalid := mcp.CodeInvalidRequest
	cases := []hostileCase{
		// control rows: the same requests, well formed, do reach the upstream
		{name: "control: tools/call in the session", body: hostileCall, status: http.StatusOK, forwarded: true},
		{name: "control: 2026-07-28 headers that agree", body: hostileCall, status: http.StatusOK, forwarded: true,
			header: http.Header{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo"}}},

		// Mcp-Session-Id
		{name: "duplicate Mcp-Session-Id", body: hostileList, status: bad, code: invalid, message: "Mcp-Session-Id",
			header: http.Header{"Mcp-Session-Id": {"{{session}}", "{{session}}"}}},
		{name: "empty Mcp-Session-Id", body: hostileList, status: bad, code: invalid, message: "Mcp-Session-Id",
			header: http.Header{"Mcp-Session-Id": {""}}},
		{name: "blank Mcp-Session-Id", body: hostileList, status: bad, code: invalid, message: "Mcp-Session-Id",
			header: http.Header{"Mcp-Session-Id": {" \t "}}},
		{name: "empty first, then valid Mcp-Session-Id", body: hostileCall, status: bad, code: invalid, message: "Mcp-Session-Id",
			header: http.Header{"Mcp-Session-Id": {"", "{{session}}"}}},
		{name: "valid, then empty Mcp-Session-Id", body: hostileCall, status: bad, code: invalid, message: "Mcp-Session-Id",
			header: http.Header{"Mcp-Session-Id": {"{{session}}", ""}}},
		{name: "valid, then another Mcp-Session-Id", body: hostileCall, status: bad, code: invalid, message: "Mcp-Session-Id",
			header: http.Header{"Mcp-Session-Id": {"{{session}}", "not-mine"}}},

		// Authorization: refused before authentication
		{name: "duplicate Authorization", body: hostileCall, status: bad, code: invalid, message: "Authorization",
			header: http.Header{"Authorization": {"Bearer {{token}}", "Bearer {{other-token}}"}}},
		{name: "same Authorization twice", body: hostileCall, status: bad, code: invalid, message: "Authorization",
			header: http.Header{"Authorization": {"Bearer {{token}}", "Bearer {{token}}"}}},
		{name: "empty Authorization", body: hostileCall, status: bad, code: invalid, message: "Authorization",
			header: http.Header{"Authorization": {""}}},

		// the other interpreted headers
		{name: "duplicate MCP-Protocol-Version", body: hostileList, status: bad, code: invalid, message: "Mcp-Protocol-Version",
			header: http.Header{"Mcp-Protocol-Version": {"2025-06-18", "2025-11-25"}}},
		{name: "empty Mcp-Method", body: hostileList, status: bad, code: invalid, message: "Mcp-Method",
			header: http.Header{"Mcp-Method": {""}}},
		{name: "duplicate Mcp-Name", body: hostileCall, status: bad, code: invalid, message: "Mcp-Name",
			header: http.Header{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo", "echo"}}},
		{name: "empty Last-Event-ID on GET", method: http.MethodGet, status: bad, code: invalid, message: "Last-Event-Id",
			header: http.Header{"Accept": {"text/event-stream"}, "Last-Event-Id": {""}}},
		{name: "duplicate Last-Event-ID on GET", method: http.MethodGet, status: bad, code: invalid, message: "Last-Event-Id",
			header: http.Header{"Accept": {"text/event-stream"}, "Last-Event-Id": {"1", "2"}}},
		{name: "duplicate Mcp-Session-Id on DELETE", method: http.MethodDelete, status: bad, code: invalid, message: "Mcp-Session-Id",
			header: http.Header{"Mcp-Session-Id": {"{{session}}", "{{session}}"}}},
		// (net/http itself refuses other control characters in a field line)
		{name: "tab inside Mcp-Session-Id", body: hostileList, status: bad, code: invalid, message: "control character",
			header: http.Header{"Mcp-Session-Id": {"{{session}}\tx"}}},
		{name: "tab inside Mcp-Name", body: hostileCall, status: bad, code: invalid, message: "control character",
			header: http.Header{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"ec\tho"}}},

		// the body: one JSON value and nothing after it
		{name: "NUL then a second message", status: bad, code: mcp.CodeParseError,
			body: hostileList + "\x00" + hostileCall},
		{name: "NUL after the message", status: bad, code: mcp.CodeParseError, body: hostileCall + "\x00"},
		{name: "trailing garbage", status: bad, code: mcp.CodeParseError, body: hostileCall + " garbage"},
		{name: "two messages", status: bad, code: mcp.CodeParseError, body: hostileList + hostileCall},
		{name: "batch under 2025-03-26", status: bad, code: invalid, message: mcp.BatchRefusedMessage,
			header: http.Header{"Mcp-Protocol-Version": {"2025-03-26"}}, body: "[" + hostileCall + "]"},
		{name: "batch under 2025-06-18", status: bad, code: invalid, message: mcp.BatchRefusedMessage,
			body: "[" + hostileList + "," + hostileCall + "]"},
		// the body's charset: read as UTF-8 here, it must be read so upstream
		// ("+AHQ-ools/call" is tools/call in UTF-7; the gateway saw an unknown method)
		{name: "control: charset utf-8", body: hostileCall, status: http.StatusOK, forwarded: true,
			header: http.Header{"Content-Type": {"application/json; charset=UTF-8"}}},
		{name: "charset utf-7 smuggling tools/call", status: http.StatusUnsupportedMediaType, code: invalid, message: "UTF-8",
			header: http.Header{"Content-Type": {"application/json; charset=utf-7"}},
			body:   `{"jsonrpc":"2.0","id":2,"method":"+AHQ-ools/call","params":{"name":"+AHM-ecret"}}`},
		{name: "charset utf-16", body: hostileList, status: http.StatusUnsupportedMediaType, code: invalid, message: "UTF-8",
			header: http.Header{"Content-Type": {"application/json;charset=\"utf-16\""}}},
		{name: "unparseable Content-Type naming a charset", body: hostileList, status: http.StatusUnsupportedMediaType, code: invalid,
			header: http.Header{"Content-Type": {"application/json; charset"}}},

		// messages an upstream would read otherwise
		{name: "tools/call without an id", status: bad, code: invalid, message: "needs an id",
			body: `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`},
		{name: "cancellation of a fractional requestId", status: bad, code: mcp.CodeInvalidParams, message: "requestId",
			body: `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2.5}}`},

		{name: "Content-Length over the limit, body never sent", status: http.StatusRequestEntityTooLarge, code: invalid,
			body: `{"jsonrpc":"2.0",`, declared: 64 << 20},
	}
	// Method names must be exact (a variant would pass ungoverned, and an
	// upstream that trims or folds would run it).
	for _, method := range []string{
		"Tools/call", "tools/Call", "TOOLS/CALL", "tools/call ", " tools/call", `tools/call\u0000`, `tools/call\t`,
		`tools/call\u00a0`, `\ufefftools/call`, `tool\u017F/call`,
		" initialize", "Initialize", "TOOLS/LIST", "Tools/list", "resources/Read", "Prompts/get", "PING",
		"notifications/Initialized",
		"", // the engine would count it as a tools/call
	} {
		cases = append(cases, hostileCase{
			name: "method " + strconv.Quote(method), status: bad, code: invalid, message: "not exact",
			body: `{"jsonrpc":"2.0","id":3,"method":"` + method + `","params":{"name":"echo","uri":"file:///a","arguments":{"text":"x"}}}`,
		})
	}
	return cases
}

// TestHostileInputs: every hostile row is refused with its status and
// JSON-RPC code, and nothing of it reaches the upstream, which counts every
// HTTP request it receives (env.requests: the go-sdk handler wrapped by the
// demo upstream's OnRequest hook).
func TestHostileInputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{})
	addr := strings.TrimPrefix(e.base[0], "http://")
	vars := map[string]string{
		"{{token}}":       token(t, "acme", "alice"),
		"{{other-token}}": token(t, "globex", "eve"),
	}
	init := post(t, e.mcpURL(0), vars["{{token}}"], initializeBody, nil)
	vars["{{session}}"] = init.Header.Get(mcp.HeaderSessionID)
	if init.Status != http.StatusOK || vars["{{session}}"] == "" {
		t.Fatalf("initialize: %d %s", init.Status, init.Body)
	}
	initialized := post(t, e.mcpURL(0), vars["{{token}}"], `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		http.Header{mcp.HeaderSessionID: {vars["{{session}}"]}})
	if initialized.Status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s", initialized.Status, initialized.Body)
	}

	for _, c := range hostileCases() {
		t.Run(c.name, func(t *testing.T) {
			before := len(e.requests())
			r := sendHostile(t, addr, c, vars)
			if r.Status != c.status {
				t.Fatalf("status %d, want %d: %s", r.Status, c.status, r.Body)
			}
			if c.code != 0 && (r.Msg.Error == nil || r.Msg.Error.Code != c.code) {
				t.Fatalf("JSON-RPC error %s, want code %d", r.Body, c.code)
			}
			if c.message != "" && (r.Msg.Error == nil || !strings.Contains(r.Msg.Error.Message, c.message)) {
				t.Fatalf("error message %s, want it to contain %q", r.Body, c.message)
			}
			want := before
			if c.forwarded {
				want++
			}
			if got := len(e.requests()); got != want {
				t.Fatalf("upstream saw %d requests for this row, want %d", got-before, want-before)
			}
		})
	}
}

// sendHostile writes c as raw HTTP/1.1 on a new connection to addr and
// reads the answer (for an event stream, the first JSON-RPC response in it).
func sendHostile(t *testing.T, addr string, c hostileCase, vars map[string]string) *response {
	t.Helper()
	expand := func(s string) string {
		for k, v := range vars {
			s = strings.ReplaceAll(s, k, v)
		}
		return s
	}
	method := c.method
	if method == "" {
		method = http.MethodPost
	}
	hdr := http.Header{
		"Content-Type":         {"application/json"},
		"Accept":               {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {"2025-06-18"},
		"Authorization":        {"Bearer {{token}}"},
		"Mcp-Session-Id":       {"{{session}}"},
	}
	for k, v := range c.header {
		hdr[k] = v
	}
	body := expand(c.body)
	var b strings.Builder
	fmt.Fprintf(&b, "%s /mcp HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, addr)
	for _, k := range slices.Sorted(maps.Keys(hdr)) {
		for _, v := range hdr[k] {
			fmt.Fprintf(&b, "%s: %s\r\n", k, expand(v))
		}
	}
	switch {
	case c.declared != 0:
		fmt.Fprintf(&b, "Content-Length: %d\r\n", c.declared)
	case body != "" || method == http.MethodPost:
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A deadline only so that a gateway waiting for bytes that never come
	// fails the row instead of hanging the test; no timing is asserted.
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	req := &http.Request{Method: method, URL: &url.URL{Path: "/mcp"}}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	r := &response{Status: resp.StatusCode, Header: resp.Header, Body: raw}
	data := raw
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data = nil
		for _, ev := range parseEvents(raw) {
			var m rpcMessage
			if json.Unmarshal([]byte(ev.data), &m) == nil && (m.Result != nil || m.Error != nil) {
				data = []byte(ev.data)
				break
			}
		}
	}
	if len(data) > 0 {
		_ = json.Unmarshal(data, &r.Msg)
	}
	return r
}
