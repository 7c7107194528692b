package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// writeCallDenied answers a denied call as mode (Config.DenyAs) says:
// writeDenied's 429, or writeDeniedResult's tool result. Either way the
// denial has already been counted (metrics, the breaker's consecutive
// denials) and nothing was charged: only the answer differs. outputSchema
// reports whether the called tool declares an outputSchema (see
// toolSchemas).
func writeCallDenied(w http.ResponseWriter, mode policy.DenyMode, id json.RawMessage, d enforce.Decision, outputSchema bool, now time.Time) {
	if mode == policy.DenyResult {
		writeDeniedResult(w, id, d, outputSchema, now)
		return
	}
	writeDenied(w, id, d, now)
}

// writeDeniedResult answers a denied tools/call with HTTP 200 and a result
// with isError: true: a text naming the limit and the retry time, for the
// model, and the data a 429 carries in error.data, for the client, in
// _meta and, unless the tool declares an outputSchema, as
// structuredContent (enforce.Decision.Result). Retry-After and the
// rate-limit headers are those of a 429. MCP clients turn a 429 into a
// transport error without reading its body (the Go SDK's does not even
// decode it), so a model behind them never learns the retry time; a tool
// result reaches it. The answer is JSON even when the client accepts SSE:
// Streamable HTTP lets the server choose.
func writeDeniedResult(w http.ResponseWriter, id json.RawMessage, d enforce.Decision, outputSchema bool, now time.Time) {
	denialHeaders(w, d, now)
	body, err := json.Marshal(d.Result(outputSchema))
	if err != nil { // cannot happen: strings and integers only
		writeDenied(w, id, d, now)
		return
	}
	writeRPC(w, http.StatusOK, id, "result", body)
}

// denialHeaders sets Retry-After and the rate-limit headers of a denial.
func denialHeaders(w http.ResponseWriter, d enforce.Decision, now time.Time) {
	setRateHeaders(w.Header(), d.Limit, now)
	w.Header().Set("Retry-After", strconv.FormatInt(enforce.RetryAfterSeconds(d.Limit), 10))
}

// writeDenied answers a denied call: 429, Retry-After, rate-limit headers and
// a JSON-RPC error carrying the request's id and code -33029.
func writeDenied(w http.ResponseWriter, id json.RawMessage, d enforce.Decision, now time.Time) {
	denialHeaders(w, d, now)
	mcp.WriteError(w, http.StatusTooManyRequests, id, CodeRateLimited, d.Message(), d.Denial())
}
