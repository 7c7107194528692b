package gateway

import (
	"log"
	"net"
	"net/http"

	"github.com/mcpgate/mcpgate/policy"
)

// HTTPServer returns the http.Server that serves g under the server section
// of the config in force: headers within read_header_timeout, keep-alive
// connections closed after idle_timeout. errorLog receives the server's own
// errors (nil: the log package's standard logger).
//
// It deliberately sets no ReadTimeout or WriteTimeout: net/http measures
// both over the whole exchange, and an expiring read deadline cancels the
// request's context, which would end every GET stream and long tools/call
// after one timeout. The MCP endpoint bounds the body read and each write
// instead (see protect). Settings read here apply at start only; the
// per-request ones (read_timeout, write_timeout, allowed_origins) follow
// reloads.
func (g *Gateway) HTTPServer(errorLog *log.Logger) *http.Server {
	s := g.Config().Server
	return &http.Server{
		Handler:           g,
		ReadHeaderTimeout: s.ReadHeaderTimeout,
		IdleTimeout:       s.IdleTimeout,
		ErrorLog:          errorLog,
		ConnState:         trackIdle,
	}
}

// Listener wraps ln so that at most server.max_connections client
// connections are open at once (read at start); the count is the
// mcpgate_open_connections gauge; a config not from policy.Parse (zero)
// gets policy.DefaultMaxConnections. At the cap, a new client gets the slot
// of the listener's connection idle longest (closed) when its server is
// HTTPServer's, or else waits for one to close. Closing the returned listener closes ln.
func (g *Gateway) Listener(ln net.Listener) net.Listener {
	max := g.Config().Server.MaxConnections
	if max <= 0 {
		max = policy.DefaultMaxConnections
	}
	return newLimitListener(ln, max, g.metrics.OpenConnections)
}
