package enforce

import (
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// breakerDecision describes an open breaker as a limit.Decision, for the
// same headers and body as other denials. A refusal because another call's
// probe is in flight says retry within ProbeRetry, not at the end of the
// probe's lease: the probe's outcome is usually known by then.
func breakerDecision(b *limit.BreakerSpec, st limit.BreakerState) limit.Decision {
	retry := st.RetryAfter
	if st.HalfOpen {
		retry = min(retry, ProbeRetry)
	}
	return limit.Decision{
		Rule:       limit.Rule{Name: BreakerRule, Period: max(st.Cooldown, b.Cooldown)},
		ResetAfter: retry,
		RetryAfter: retry,
	}
}

// quotaDecision describes a quota denial as a limit.Decision, so that the
// same headers and body are written: the window is the billing period and
// the retry time its end.
func quotaDecision(m *limit.Meter, u limit.Usage, now time.Time) limit.Decision {
	start, _ := usage.PeriodStart(m.Period)
	end, _ := usage.PeriodEnd(m.Period)
	left := max(0, m.Quota-u.Used())
	return limit.Decision{
		Rule:       limit.Rule{Name: QuotaRule, Period: end.Sub(start)},
		Limit:      m.Quota,
		Remaining:  left,
		ResetAfter: end.Sub(now),
		RetryAfter: max(end.Sub(now), time.Second),
	}
}

// JSON-RPC error codes of the answers mcpgate gives itself, the same in
// every adapter (gateway, gosdk). They sit outside the ranges JSON-RPC
// (-32768..-32000) and MCP reserve, so they cannot collide with a
// server's own codes.
const (
	// CodeRateLimited: denied by a rate limit, the monthly quota or the
	// loop breaker; the error's data is a Denial.
	CodeRateLimited = -33029
	// CodeUnauthorized: no or bad credentials.
	CodeUnauthorized = -33001
	// CodeForbidden: a tool, resource or prompt outside the caller's scopes.
	CodeForbidden = -33003
	// CodeUnavailable: the limit store is unavailable and the request's
	// on_error policy is closed (Decision.Unavailable).
	CodeUnavailable = -33503
)

// Message is a denied call's JSON-RPC error message.
func (d Decision) Message() string {
	if d.Never() {
		return fmt.Sprintf("call cost exceeds the capacity of %s rule %q: it can never be admitted", d.Scope, d.Limit.Rule.Name)
	}
	return fmt.Sprintf("rate limit exceeded (%s rule %q); retry in %ds", d.Scope, d.Limit.Rule.Name, RetryAfterSeconds(d.Limit))
}

// Text is what a model reads of a denial answered as a tool result
// (deny_as: result): what was limited, and when to retry, in the seconds of
// Denial's retry_after_seconds so that text and data agree.
func (d Decision) Text() string {
	if d.Never() {
		return fmt.Sprintf("Call refused: its cost exceeds the capacity of %s rule %q, so it can never be admitted. Do not retry it.", d.Scope, d.Limit.Rule.Name)
	}
	secs := RetryAfterSeconds(d.Limit)
	retry := "retry in 1 second."
	if secs != 1 {
		retry = fmt.Sprintf("retry in %d seconds.", secs)
	}
	switch d.Scope {
	case ScopeQuota:
		return fmt.Sprintf("Monthly quota used up (quota rule %q, %d cost units): %s", d.Limit.Rule.Name, d.Limit.Limit, retry)
	case ScopeBreaker:
		return fmt.Sprintf("Loop breaker open (breaker rule %q: too many denied, failed or identical calls in a row): %s", d.Limit.Rule.Name, retry)
	}
	return fmt.Sprintf("Rate limit reached (%s rule %q): %s", d.Scope, d.Limit.Rule.Name, retry)
}

// MetaDenial is the _meta key under which a DeniedResult carries its
// Denial. MCP reserves _meta prefixes whose second label is mcp or
// modelcontextprotocol; "io.mcpgate/" is a vendor prefix in the reverse
// DNS form the specification recommends.
const MetaDenial = "io.mcpgate/denial"

// DeniedResult is a tools/call result (MCP CallToolResult) reporting a
// denial to the model: see Decision.Result.
type DeniedResult struct {
	Content []DeniedText `json:"content"`
	// StructuredContent is the Denial, nil for a tool that declares an
	// outputSchema.
	StructuredContent *Denial    `json:"structuredContent,omitempty"`
	IsError           bool       `json:"isError"`
	Meta              DeniedMeta `json:"_meta"`
}

// DeniedText is the text content of a DeniedResult.
type DeniedText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// DeniedMeta is the _meta of a DeniedResult: the Denial under MetaDenial.
type DeniedMeta struct {
	Denial Denial `json:"io.mcpgate/denial"`
}

// Result is a denied tools/call's answer under deny_as: result: isError,
// Text for the model, and the Denial in _meta (under MetaDenial) and, for
// a tool that does not declare an outputSchema (outputSchema false), as
// structuredContent too. A tool's structuredContent must match its
// outputSchema, and a client may check that even when isError is true
// (the TypeScript SDK's does, and throws): for such a tool the Denial,
// which matches no tool's schema, is left out of structuredContent.
func (d Decision) Result(outputSchema bool) DeniedResult {
	den := d.Denial()
	r := DeniedResult{Content: []DeniedText{{Type: "text", Text: d.Text()}}, IsError: true, Meta: DeniedMeta{Denial: den}}
	if !outputSchema {
		r.StructuredContent = &den
	}
	return r
}
