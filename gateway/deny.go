package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
)

// writeCallDenied answers a denied tools/call as mode (Config.DenyAs) says:
// writeDenied's 429, or writeDeniedResult's tool result. Either way the
// denial has already been counted (metrics, the breaker's consecutive
// denials) and nothing was charged: only the answer differs.
func writeCallDenied(w http.ResponseWriter, mode policy.DenyMode, id json.RawMessage, d limit.Decision, scope string, now time.Time) {
	if mode == policy.DenyResult {
		writeDeniedResult(w, id, d, scope, now)
		return
	}
	writeDenied(w, id, d, scope, now)
}

// deniedResult is a tools/call result (MCP CallToolResult) that reports a
// denial to the model.
type deniedResult struct {
	Content           []deniedText `json:"content"`
	StructuredContent deniedData   `json:"structuredContent"`
	IsError           bool         `json:"isError"`
}

type deniedText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// writeDeniedResult answers a denied tools/call with HTTP 200 and a result
// with isError: true: a text naming the limit and the retry time, for the
// model, and structuredContent with the data a 429 carries in error.data,
// for the client. Retry-After and the rate-limit headers are those of a 429.
// MCP clients turn a 429 into a transport error without reading its body
// (the Go SDK's does not even decode it), so a model behind them never
// learns the retry time; a tool result reaches it. The answer is JSON even
// when the client accepts SSE: Streamable HTTP lets the server choose.
func writeDeniedResult(w http.ResponseWriter, id json.RawMessage, d limit.Decision, scope string, now time.Time) {
	data := denialHeaders(w, d, scope, now)
	body, err := json.Marshal(deniedResult{
		Content:           []deniedText{{Type: "text", Text: denialText(d, scope, data.RetryAfterSeconds)}},
		StructuredContent: data,
		IsError:           true,
	})
	if err != nil { // cannot happen: strings and integers only
		writeDenied(w, id, d, scope, now)
		return
	}
	writeRPC(w, http.StatusOK, id, "result", body)
}

// denialText is what the model reads: what was limited, and when to retry
// (in the seconds of retry_after_seconds, so text and data agree).
func denialText(d limit.Decision, scope string, retrySeconds int64) string {
	if d.RetryAfter == limit.Never {
		return fmt.Sprintf("Call refused: its cost exceeds the capacity of %s rule %q, so it can never be admitted. Do not retry it.", scope, d.Rule.Name)
	}
	retry := "retry in 1 second."
	if retrySeconds != 1 {
		retry = fmt.Sprintf("retry in %d seconds.", retrySeconds)
	}
	switch scope {
	case "quota":
		return fmt.Sprintf("Monthly quota used up (quota rule %q, %d cost units): %s", d.Rule.Name, d.Limit, retry)
	case "breaker":
		return fmt.Sprintf("Loop breaker open (breaker rule %q: too many denied, failed or identical calls in a row): %s", d.Rule.Name, retry)
	}
	return fmt.Sprintf("Rate limit reached (%s rule %q): %s", scope, d.Rule.Name, retry)
}
