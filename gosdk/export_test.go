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
