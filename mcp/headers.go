package mcp

import (
	"net/http"
	"strings"
)

// MCP transport headers (canonical form).
const (
	HeaderSessionID       = "Mcp-Session-Id"
	HeaderProtocolVersion = "Mcp-Protocol-Version"
	HeaderMethod          = "Mcp-Method"
	HeaderName            = "Mcp-Name"
	HeaderLastEventID     = "Last-Event-Id"
	// HeaderParamPrefix starts the Mcp-Param-* headers MCP 2026-07-28 derives
	// from tool arguments annotated with x-mcp-header; the upstream checks
	// them against the body, so they are forwarded untouched.
	HeaderParamPrefix = "Mcp-Param-"

	// Identity headers the gateway may add to upstream requests. A client
	// can never set them: they are not on the forwarding allowlist.
	HeaderTenant  = "X-Mcp-Tenant"
	HeaderSubject = "X-Mcp-Subject"
)

// forwardRequestHeaders is the allowlist of client request headers copied
// upstream. Everything else is dropped, notably Authorization and Cookie (MCP
// forbids passing the caller's token through), Forwarded/X-Forwarded-* and
// the identity headers, which only the gateway may set.
var forwardRequestHeaders = []string{
	HeaderSessionID,
	HeaderProtocolVersion,
	HeaderLastEventID,
	HeaderMethod,
	HeaderName,
	"Accept",
	"Content-Type",
	"User-Agent",
	"Traceparent", // W3C trace context: lets a trace span the gateway
	"Tracestate",
}

// forwardResponseHeaders is the allowlist of upstream response headers copied
// to the client. Upstream cookies, auth challenges (aimed at the gateway's
// own upstream credential) and Location are not passed on.
var forwardResponseHeaders = []string{
	HeaderSessionID,
	"Content-Type",
	"Cache-Control",
	"Allow",       // on 405, e.g. a stateless upstream refusing GET
	"Retry-After", // on 429/503 from the upstream
}

// copyRequestHeaders copies the allowlisted headers of src into dst.
func copyRequestHeaders(dst, src http.Header) {
	for _, k := range forwardRequestHeaders {
		if v := src.Values(k); len(v) > 0 {
			dst[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
		}
	}
	for k, v := range src {
		if ck := http.CanonicalHeaderKey(k); strings.HasPrefix(ck, HeaderParamPrefix) && len(ck) > len(HeaderParamPrefix) {
			dst[ck] = append(dst[ck], v...)
		}
	}
}

// CheckHeaders enforces MCP 2026-07-28's rule that the Mcp-Method and
// Mcp-Name headers agree with the body: when Mcp-Method is present every
// value must equal m.Method, and when Mcp-Name is present every value must
// equal m.Name (params.name of tools/call and prompts/get, params.uri of
// resources/read, "" for other methods). A mismatch is a 400 *Error with
// code CodeHeaderMismatch carrying the request's id; nil means the headers
// are absent or agree.
//
// The check applies whatever MCP-Protocol-Version the client announces:
// intermediaries may route on these headers, so a message whose headers lie
// about its body is refused rather than forwarded. Absence is not checked
// (under 2026-07-28 the upstream itself refuses a request missing them), nor
// are the Mcp-Param-* headers, which need the tool's input schema.
func CheckHeaders(r *http.Request, m *Message) *Error {
	if m == nil {
		return nil
	}
	mismatch := func(header, got, want string) *Error {
		return newError(http.StatusBadRequest, CodeHeaderMismatch, m.ID,
			"header mismatch: %s header value %q does not match body value %q", header, got, want)
	}
	for _, v := range r.Header.Values(HeaderMethod) {
		if v != m.Method {
			return mismatch(HeaderMethod, v, m.Method)
		}
	}
	for _, v := range r.Header.Values(HeaderName) {
		if v != m.Name {
			return mismatch(HeaderName, v, m.Name)
		}
	}
	return nil
}
