package mcp

import (
	"fmt"
	"mime"
	"net/http"
	"strconv"
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
//
// Mcp-Session-Id and Last-Event-Id are copied as the request has them: both
// name upstream state (a session, a stream an event store can replay), so a
// caller serving several principals must put there only ids it bound to the
// principal (the gateway unwraps its bound ids into the request first:
// gateway/session.go, gateway/eventid.go).
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

// CheckCharset refuses (415, CodeInvalidRequest) a POST body whose
// Content-Type declares a charset other than UTF-8: the gateway reads the
// body as UTF-8 JSON, while an upstream that honours the charset (the
// TypeScript SDK's decodes through iconv-lite) would read other text: in
// UTF-7, "+AHQ-ools/call" is tools/call, a method the gateway would have
// seen as an unknown one and let through ungoverned. A Content-Type that
// does not parse but mentions a charset is refused too. The proxy also
// forwards POST bodies as plain application/json (Proxy.Start).
func CheckCharset(h http.Header) *Error {
	ct := h.Get("Content-Type")
	if !strings.Contains(ct, ";") {
		return nil // no parameter, no charset (and no allocation)
	}
	_, params, err := mime.ParseMediaType(ct)
	cs, declared := params["charset"]
	if err != nil {
		declared = strings.Contains(strings.ToLower(ct), "charset")
	}
	if !declared || strings.EqualFold(cs, "utf-8") || strings.EqualFold(cs, "utf8") {
		return nil
	}
	return newError(http.StatusUnsupportedMediaType, CodeInvalidRequest, nil,
		"Content-Type %s: the body must be UTF-8 JSON (charset utf-8 or none)", quoteCapped(ct))
}

// interpretedHeaders are the request headers the gateway reads and acts on
// (canonical form): each must carry one value that every reader agrees on.
var interpretedHeaders = [...]string{
	HeaderSessionID,
	HeaderProtocolVersion,
	"Authorization",
	HeaderMethod,
	HeaderName,
	HeaderLastEventID,
}

// CheckRequestHeaders refuses a request whose interpreted headers could be
// read two ways. Each of Mcp-Session-Id, MCP-Protocol-Version,
// Authorization, Mcp-Method, Mcp-Name and Last-Event-ID, when present, must
//
//   - appear once: one value in total over every key of h that equals the
//     name ignoring ASCII case (a non-canonical key counts too);
//   - not be empty once leading and trailing spaces and tabs (HTTP's
//     optional whitespace) are removed;
//   - contain no control character (0x00-0x1F or 0x7F; a tab inside the
//     value included).
//
// Why: the gateway reads one value (Header.Get returns the first) and
// forwards them all, and an upstream may read another. An empty first
// Mcp-Session-Id once made the gateway skip its session-binding check while
// an upstream reading the last value ran the call in another tenant's
// session; two Authorization values could authenticate one caller and
// attribute the call to another. Refusing is the only reading both sides
// share. Absent headers are not checked here (whether a header is required
// depends on the method and the protocol version).
//
// The result is nil when the headers are acceptable, else a 400 *Error with
// code CodeInvalidRequest, no id (the body is not read yet), matching
// ErrBadHeader, whose message names the first offending header in the order
// above. A value is quoted in at most 64 bytes (cut and marked "..."), and
// an Authorization value (a credential) never. h is only read.
func CheckRequestHeaders(h http.Header) *Error {
	var count [len(interpretedHeaders)]int
	var value [len(interpretedHeaders)]string // the value, when count is 1
	for k, vs := range h {
		if i := interpretedIndex(k); i >= 0 {
			count[i] += len(vs)
			if len(vs) > 0 {
				value[i] = vs[0]
			}
		}
	}
	for i, name := range interpretedHeaders {
		if why := headerProblem(name, count[i], value[i]); why != "" {
			e := newError(http.StatusBadRequest, CodeInvalidRequest, nil, "header %s %s", name, why)
			e.Err = ErrBadHeader
			return e
		}
	}
	return nil
}

// interpretedIndex returns the index in interpretedHeaders of the header
// key names (ignoring ASCII case), or -1.
func interpretedIndex(key string) int {
	for i, name := range interpretedHeaders {
		if key == name {
			return i
		}
	}
	for i, name := range interpretedHeaders {
		if asciiEqualFold(key, name) {
			return i
		}
	}
	return -1
}

// headerProblem says what is wrong with a header sent n times whose (only,
// when n is 1) value is v, or "" when nothing is.
func headerProblem(name string, n int, v string) string {
	switch {
	case n == 0:
		return ""
	case n > 1:
		return "appears " + strconv.Itoa(n) + " times: send it once"
	}
	v = strings.Trim(v, " \t")
	if v == "" {
		return "is empty"
	}
	i := strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f })
	if i < 0 {
		return ""
	}
	why := fmt.Sprintf("contains a control character (0x%02x at byte %d)", v[i], i)
	if name == "Authorization" {
		return why
	}
	return why + ": " + quoteCapped(v)
}

// asciiEqualFold reports whether a and b are equal ignoring ASCII case, the
// only folding HTTP applies to field names.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
