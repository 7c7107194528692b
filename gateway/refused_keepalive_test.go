package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A POST without a body (Content-Length: 0) refused 401 before readBody:
// net/http started its background read before the handler (no body
// remains). A read deadline of now set as the handler returned (the first
// form of drainUnread) made that read fail, and net/http cancelled the
// connection's context while keeping it alive: the next request on it ran
// with a context cancelled from the start, and a valid call got 202 with
// no body. The connection must stay usable.
func TestEmptyPostRefusalKeepsTheConnectionUsable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: stateless, Config: "server: {read_timeout: 1h}\n"})
	addr, _ := serveRealListener(t, e)
	for i := range 20 {
		if !emptyRefusalThenCall(t, addr, i) {
			return
		}
	}
}

func emptyRefusalThenCall(t *testing.T, addr string, i int) bool {
	c := dialRaw(t, addr)
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer nope\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: 0\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	if resp.Close {
		t.Fatalf("connection closed after the refusal")
	}
	globex := token(t, "globex", "bob")
	body := callBody(1, "echo", map[string]any{"text": "x"})
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", globex, len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	resp, err = http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("a valid call on the connection kept alive after the 401: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("try %d: a valid tools/call on the connection kept alive after a 401 to an empty POST: status %d body %q", i, resp.StatusCode, b)
		return false
	}
	return true
}

// A client that sent its whole POST (a 10 KB body, all on the wire before
// the answer) and is refused 401 keeps its connection: the drain has
// drainGrace to read what is already there. Under a deadline of now it read
// nothing past net/http's 4 KiB buffer, and the connection closed: an
// honest client refused (a 429 from the tenant's cap, say) reconnected for
// its next request.
func TestFullySentBodyRefusalKeepsAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: stateless, Config: "server: {read_timeout: 1h}\n"})
	addr, _ := serveRealListener(t, e)
	body := callBody(1, "echo", map[string]any{"text": strings.Repeat("x", 10000)})
	c := dialRaw(t, addr)
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer nope\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Close {
		t.Fatalf("401 to a POST whose %d-byte body was all sent: status %d, connection closed %v; want keep-alive", len(body), resp.StatusCode, resp.Close)
	}
}
