package gosdk

import (
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
)

// MiddlewareWithoutSending is Middleware as in a process where no
// SendingMiddleware was ever installed (the tests of the package install
// one, and the flag is the process's).
func MiddlewareWithoutSending(e *enforce.Engine, opts *Options) mcp.Middleware {
	m := newMiddleware(e, opts)
	m.sending = new(atomic.Bool)
	return m.wrap
}

// MiddlewareSettling is Middleware that tells settled how each admitted
// tools/call ended.
func MiddlewareSettling(e *enforce.Engine, opts *Options, settled func(tool string, st enforce.Status)) mcp.Middleware {
	m := newMiddleware(e, opts)
	m.settled = settled
	return m.wrap
}
