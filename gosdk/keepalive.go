package gosdk

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrKeepAliveRefused means the SDK's handler refused a keep-alive ping:
// the session is gone (or the request was not one of a session).
var ErrKeepAliveRefused = errors.New("gosdk: keep-alive ping refused")

// keepAliveHeader carries the nonce of a ping KeepAlive posts. A client
// may send the header too, but cannot name a nonce in keepAlives: each is
// random, held in this process only, for the one ping.
const keepAliveHeader = "Mcpgate-Keep-Alive"

var keepAlives sync.Map // nonce → struct{}: the keep-alive pings in flight

// KeepAlive posts a ping, in process, through h (the SDK's Streamable
// HTTP handler) into the session of r, a request of that session (its
// client's GET stream): a request the server itself makes to keep alive
// the session of a client that only listens, which the SDK's
// SessionTimeout, counting POSTs only, would end. Middleware passes it
// through ungoverned, neither admitted nor counted: the tenant did not
// send it, and must not spend its limits on it. Only such a ping is
// passed so; a client cannot mark its own requests this way.
//
// The ping carries r's host, Mcp-Session-Id, MCP-Protocol-Version and its
// context's auth.TokenInfo (the SDK binds a session to its caller); its
// JSON-RPC id is random, so that it cannot collide with one of the
// client's own requests in flight. The answer is discarded; a refusal
// (the session is gone) is ErrKeepAliveRefused.
func KeepAlive(ctx context.Context, h http.Handler, r *http.Request) error {
	nonce := crand.Text()
	id := strconv.Quote("mcpgate-keepalive-" + crand.Text())
	ping, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL.String(),
		strings.NewReader(`{"jsonrpc":"2.0","id":`+id+`,"method":"ping"}`))
	if err != nil {
		return err
	}
	ping.Host = r.Host // the SDK refuses a request for another host
	ping.Header.Set("Mcp-Session-Id", r.Header.Get("Mcp-Session-Id"))
	ping.Header.Set("Mcp-Protocol-Version", r.Header.Get("Mcp-Protocol-Version"))
	ping.Header.Set("Content-Type", "application/json")
	ping.Header.Set("Accept", "application/json, text/event-stream")
	ping.Header.Set(keepAliveHeader, nonce)
	keepAlives.Store(nonce, struct{}{})
	defer keepAlives.Delete(nonce)
	w := &discard{header: http.Header{}, code: http.StatusOK}
	h.ServeHTTP(w, ping)
	if w.code >= http.StatusBadRequest {
		return fmt.Errorf("%w: %d %s", ErrKeepAliveRefused, w.code, http.StatusText(w.code))
	}
	return nil
}

// isKeepAlive reports whether req is a ping KeepAlive posted.
func isKeepAlive(method string, req mcp.Request) bool {
	if method != "ping" {
		return false
	}
	_, ok := marked(req, keepAliveHeader, &keepAlives)
	return ok
}

// discard is a ResponseWriter that keeps the status only: the answer to
// an in-process keep-alive ping.
type discard struct {
	header http.Header
	code   int
}

func (d *discard) Header() http.Header       { return d.header }
func (*discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(code int)      { d.code = code }
func (*discard) Flush()                      {}
