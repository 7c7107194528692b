package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/mcpgate/mcpgate/mcp"
)

// ErrForeignOrigin means a request's Origin header is not one the MCP
// endpoint accepts (see checkOrigin).
var ErrForeignOrigin = errors.New("origin not allowed")

// checkOrigin is MCP's Origin validation (2025-11-25: servers must validate
// Origin, against DNS rebinding). It returns nil when the request
//   - has no Origin (non-browser clients send none),
//   - has an Origin in allowed ("*" accepts any single value; entries
//     compare by scheme, host and port, the default port implied), or
//   - is same-origin on a host no DNS rebinding can forge: Origin's
//     host:port equals the Host header's and that host is an IP literal or
//     localhost (*.localhost). A rebinding page sends its own name in both
//     Origin and Host, so equality alone proves nothing for a DNS name, and
//     mcpgate serves no pages a same-origin browser request could come from.
//
// Anything else, including "null", a malformed value and a repeated Origin
// header, wraps ErrForeignOrigin.
func checkOrigin(r *http.Request, allowed []string) error {
	vals := r.Header.Values("Origin")
	switch len(vals) {
	case 0:
		return nil
	case 1:
	default:
		return fmt.Errorf("%w: %d Origin headers", ErrForeignOrigin, len(vals))
	}
	for _, a := range allowed {
		if a == "*" {
			return nil
		}
	}
	o, ok := parseOrigin(vals[0])
	if !ok {
		return fmt.Errorf("%w: malformed Origin %q", ErrForeignOrigin, vals[0])
	}
	for _, a := range allowed {
		if ao, ok := parseOrigin(a); ok && ao == o {
			return nil
		}
	}
	if o.host == requestHost(r, o) && localHost(o.host) {
		return nil
	}
	return fmt.Errorf("%w: %q", ErrForeignOrigin, vals[0])
}

// origin is an Origin in comparable form: lower-case scheme, and host:port
// with the scheme's default port made explicit.
type origin struct {
	scheme string
	host   string // host:port; an IPv6 host in brackets
}

// parseOrigin reads scheme://host[:port] as browsers send it (a trailing "/"
// is tolerated, as in policy's allowed_origins); "null", paths, queries,
// fragments and user info are not origins.
func parseOrigin(s string) (origin, bool) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return origin{}, false
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = defaultPort(scheme)
	}
	return origin{scheme: scheme, host: net.JoinHostPort(strings.ToLower(u.Hostname()), port)}, true
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// requestHost is the request's Host as host:port, in o's form (a missing
// port is o's scheme's default).
func requestHost(r *http.Request, o origin) string {
	h, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		h, port = strings.Trim(r.Host, "[]"), defaultPort(o.scheme)
	}
	return net.JoinHostPort(strings.ToLower(h), port)
}

// localHost reports whether hostport names a host that DNS cannot rebind:
// an IP literal, or localhost (which browsers resolve to loopback only).
func localHost(hostport string) bool {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	return h == "localhost" || strings.HasSuffix(h, ".localhost") || net.ParseIP(h) != nil
}

// refuseOrigin answers a request from a foreign Origin: 403 with a JSON-RPC
// error, nothing forwarded.
func (g *Gateway) refuseOrigin(w http.ResponseWriter, r *http.Request, err error) {
	g.metrics.Requests.WithLabelValues("any", "forbidden").Inc()
	g.log.Debug("request refused: foreign Origin", "err", err, "host", r.Host)
	mcp.WriteError(w, http.StatusForbidden, nil, CodeForbidden,
		"Origin not allowed: list it in server.allowed_origins", nil)
}
