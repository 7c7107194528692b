package gateway

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// tracerName is the instrumentation scope of the gateway's spans.
const tracerName = "github.com/mcpgate/mcpgate/gateway"

// Span attributes. The MCP ones follow the OpenTelemetry semantic
// conventions for MCP; the mcpgate.* ones are the gateway's own. Neither
// tokens nor tool arguments are ever recorded: a trace backend is read by
// more people than the tools' data is meant for.
const (
	attrMethod         = attribute.Key("mcp.method.name")
	attrTool           = attribute.Key("gen_ai.tool.name")
	attrTenant         = attribute.Key("mcpgate.tenant")
	attrTier           = attribute.Key("mcpgate.tier")
	attrDecision       = attribute.Key("mcpgate.decision")
	attrRule           = attribute.Key("mcpgate.rule")
	attrScope          = attribute.Key("mcpgate.scope")
	attrDegraded       = attribute.Key("mcpgate.degraded")
	attrDenialCache    = attribute.Key("mcpgate.denial_cache")
	attrCache          = attribute.Key("mcpgate.cache")
	attrUpstreamStatus = attribute.Key("mcpgate.upstream.status")
	attrHTTPStatus     = attribute.Key("http.response.status_code")
	attrHTTPMethod     = attribute.Key("http.request.method")
)

// tracing makes the gateway's spans: one server span per MCP request
// (parented by the caller's traceparent), a child for the limit decision
// and one for each upstream call, whose context replaces the caller's
// traceparent upstream. A nil *tracing is tracing off: every method then
// returns at once, allocating nothing. It is safe for concurrent use.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
}

// newTracing returns the tracing of tp, nil (off) for a nil tp.
func newTracing(tp trace.TracerProvider) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer(tracerName)}
}

// requestSpan is the server span of one request and what its end needs.
// It is used by the request's goroutines one at a time (the stages run in
// sequence), except decision, which only the request goroutine writes.
type requestSpan struct {
	span     trace.Span
	decision string
}

type requestSpanKey struct{}

func requestSpanFrom(ctx context.Context) *requestSpan {
	rs, _ := ctx.Value(requestSpanKey{}).(*requestSpan)
	return rs
}

// wrap runs next inside the request's server span; off, it is next.
func (t *tracing) wrap(next http.HandlerFunc) http.HandlerFunc {
	if t == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, "mcp "+r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attrHTTPMethod.String(r.Method)))
		rs := &requestSpan{span: span}
		sw := &statusWriter{ResponseWriter: w}
		next(sw, r.WithContext(context.WithValue(ctx, requestSpanKey{}, rs)))
		rs.end(sw.status)
	}
}

func (rs *requestSpan) end(status int) {
	if status == 0 {
		status = http.StatusOK // nothing written: net/http answers 200
	}
	rs.span.SetAttributes(attrHTTPStatus.Int(status))
	decision := rs.decision
	if decision == "" {
		decision = decisionOf(status)
	}
	rs.span.SetAttributes(attrDecision.String(decision))
	if status >= 500 {
		rs.span.SetStatus(codes.Error, http.StatusText(status))
	}
	rs.span.End()
}

// decisionOf names the gateway's decision on a request no limit stage
// decided, from the status it answered.
func decisionOf(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "unauthorized"
	case http.StatusForbidden:
		return "forbidden"
	case http.StatusNotFound:
		return "bad_session"
	case http.StatusTooManyRequests:
		return "denied"
	}
	if status >= 400 && status < 500 {
		return "bad_request"
	}
	return "admitted"
}

// message names the server span after the request's method and records
// who calls what: method, tool, tenant and tier (never the arguments).
func (t *tracing) message(ctx context.Context, p auth.Principal, msg *mcp.Message) {
	if t == nil {
		return
	}
	rs := requestSpanFrom(ctx)
	if rs == nil {
		return
	}
	name := msg.Method
	if name == "" {
		name = "response"
	}
	rs.span.SetName("mcp " + name)
	rs.span.SetAttributes(attrMethod.String(name), attrTenant.String(p.Tenant), attrTier.String(p.Tier))
	if msg.ToolName != "" {
		rs.span.SetAttributes(attrTool.String(msg.ToolName))
	}
}

// cache records a cacheable call's cache outcome (hit, miss, stale,
// coalesced, bypass) on its server span.
func (t *tracing) cache(ctx context.Context, outcome string) {
	if t == nil {
		return
	}
	if rs := requestSpanFrom(ctx); rs != nil {
		rs.span.SetAttributes(attrCache.String(outcome))
	}
}

// admit is the limit stage (decide) inside a child span of the request's:
// the decision is recorded on both, its rule and scope on the server span.
func (l *limiter) admit(ctx context.Context, tenant, global ruleSet, meter *limit.Meter, br *limit.BreakerSpec, cost int64, onErr policy.FailurePolicy) verdict {
	if l.trace == nil {
		return l.decide(ctx, tenant, global, meter, br, cost, onErr)
	}
	ctx, span := l.trace.tracer.Start(ctx, "mcpgate.admit")
	v := l.decide(ctx, tenant, global, meter, br, cost, onErr)
	decision, rule, scope := v.describe()
	attrs := []attribute.KeyValue{attrDecision.String(decision)}
	if rule != "" {
		attrs = append(attrs, attrRule.String(rule), attrScope.String(scope))
	}
	if v.degraded != "" {
		attrs = append(attrs, attrDegraded.String(string(v.degraded)))
	}
	if v.fromCache {
		attrs = append(attrs, attrDenialCache.Bool(true))
	}
	// The details go on the server span only: every attribute is paid
	// for again in the export (see docs/benchmarks.md).
	span.SetAttributes(attrs[0])
	span.End()
	if rs := requestSpanFrom(ctx); rs != nil {
		rs.decision = decision
		rs.span.SetAttributes(attrs...)
	}
	return v
}

// describe names a verdict: decision (admitted, denied, unavailable), and
// for a decision a rule made, the rule and its scope.
func (v *verdict) describe() (decision, rule, scope string) {
	switch {
	case v.unavailable:
		return "unavailable", "", ""
	case v.breakerOpen:
		return "denied", breakerRule, "breaker"
	case v.quota:
		return "denied", quotaRule, "quota"
	case !v.allowed:
		return "denied", v.decision.Rule.Name, string(v.scope)
	}
	if v.decision.Rule.Name != "" {
		return "admitted", v.decision.Rule.Name, string(v.scope)
	}
	return "admitted", "", ""
}

// serveUpstream is rt.proxy.Serve inside a client span: the upstream
// receives that span's traceparent (and tracestate), not the caller's.
func (g *Gateway) serveUpstream(w http.ResponseWriter, r *http.Request, rt *runtime, fwd mcp.Forward) (int, error) {
	t := g.trace
	if t == nil {
		return rt.proxy.Serve(w, r, fwd)
	}
	name := "upstream " + r.Method
	if fwd.Msg != nil && fwd.Msg.Method != "" {
		name = "upstream " + fwd.Msg.Method
	}
	ctx, span := t.tracer.Start(r.Context(), name, trace.WithSpanKind(trace.SpanKindClient))
	h := make(http.Header, len(fwd.Header)+2)
	for k, v := range fwd.Header {
		h[k] = v
	}
	h["Tracestate"] = nil // replaces the caller's, unless the span has one
	t.prop.Inject(ctx, propagation.HeaderCarrier(h))
	fwd.Header = h
	status, err := rt.proxy.Serve(w, r, fwd)
	span.SetAttributes(attrHTTPStatus.Int(status))
	if err != nil || status >= 500 {
		msg := http.StatusText(status)
		if err != nil {
			span.RecordError(err)
			msg = err.Error()
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End()
	if rs := requestSpanFrom(r.Context()); rs != nil {
		rs.span.SetAttributes(attrUpstreamStatus.Int(status))
	}
	return status, err
}
