package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/mcpgate/mcpgate/mcp"
)

// relay is one request the gateway relays upstream: the proxy's Forward,
// and what the gateway does at the steps of the proxy's mcp.Exchange, each
// optional. The proxy knows nothing of them: relayUpstream drives the
// exchange and runs them in order.
type relay struct {
	mcp.Forward
	// accepted runs once the upstream's response headers arrived or the
	// request failed before them (the session order: order.go).
	accepted func()
	// session returns the session id the client gets for the one the
	// upstream answered (sessions are bound to callers: session.go; the
	// request's own session comes back as the client sent it, lease
	// included: sessionBinder.answer). It runs as soon as the upstream's
	// headers are in, also when the answer then fails (a 502 without the
	// header).
	session func(upstream string) string
	// answered receives the response to a request before the client has
	// it: the call is settled on its outcome (breaker, cost, cache,
	// audit) before the client can send its next one.
	answered func(result, rpcErr json.RawMessage)
}

// relayUpstream relays fwd through proxy to the upstream and the answer
// back to w: the exchange's steps, with the gateway's own between them.
func relayUpstream(w http.ResponseWriter, r *http.Request, proxy *mcp.Proxy, fwd relay) (int, error) {
	x := proxy.Start(w, r, fwd.Forward)
	defer x.Close() // a step that panics leaves nothing held
	if fwd.accepted != nil {
		fwd.accepted()
	}
	if id := x.SessionID(); id != "" && fwd.session != nil {
		x.SetSessionID(fwd.session(id))
	}
	if fwd.answered != nil {
		if result, rpcErr, ok := x.Answer(); ok {
			fwd.answered(result, rpcErr)
		}
	}
	return x.Finish()
}
