package gateway

import (
	"context"
	"net/http"
	"sync"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/clip"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/mcp"
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
	attrHTTPMethodOrig = attribute.Key("http.request.method_original")
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

// Span names are bounded: span metrics (Tempo's metrics-generator, the
// collector's spanmetrics connector) make each distinct name a Prometheus
// series, and the client chooses both the HTTP method of a request (before
// it is authenticated) and the JSON-RPC method of a message. So, as the
// OpenTelemetry semantic conventions ask, an HTTP method outside
// httpMethods is named "_OTHER" (its original in
// http.request.method_original), and a JSON-RPC method MCP does not define
// is named "other" (its original in mcp.method.name). The names are made
// once, and these maps never grow.
var (
	serverSpanNames   = spanNames("mcp ")
	upstreamSpanNames = spanNames("upstream ")
)

// httpMethods are the HTTP methods the semantic conventions know (RFC 9110
// and PATCH); any other is httpOther.
var httpMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
	http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch,
}

const (
	// httpOther stands for an HTTP method not in httpMethods.
	httpOther = "_OTHER"
	// methodOther names the span of a JSON-RPC method MCP does not define.
	methodOther = "other"
	// methodResponse names the span of a message without a method (a
	// client's answer to a server's request).
	methodResponse = "response"
)

func spanNames(prefix string) map[string]string {
	methods := append(mcp.KnownMethods(), httpMethods...)
	methods = append(methods, httpOther, methodOther, methodResponse)
	m := make(map[string]string, len(methods))
	for _, v := range methods {
		m[v] = prefix + v
	}
	return m
}

// spanName is the name in names of method, a known HTTP method (or
// httpOther) or MCP method: a method MCP does not define is methodOther.
func spanName(names map[string]string, method string) string {
	if n, ok := names[method]; ok {
		return n
	}
	return names[methodOther]
}

// httpMethod is method when the semantic conventions know it, else
// httpOther.
func httpMethod(method string) string {
	for _, m := range httpMethods {
		if m == method {
			return m
		}
	}
	return httpOther
}

// maxSpanString bounds the names the client chooses (method, tool) in a
// span's attributes: they can be as long as the request body, and every
// span waits in the exporter's queue.
const maxSpanString = 256

// Start options of the two span kinds, made once: an option built per call
// is one more allocation on every traced request.
var (
	serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// newTracing returns the tracing of tp, nil (off) for a nil tp.
func newTracing(tp trace.TracerProvider) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer(tracerName)}
}

// requestSpan is the server span of one request and what its end needs.
// The request's stages add attributes to attrs, set on the span in one
// call when it ends: every SetAttributes call locks the span and may grow
// its attribute slice, and a request adds up to a dozen. mu guards all
// fields, since a stage's goroutine may outlive the handler; what is added
// after end is dropped, as the SDK drops attributes set after End. A
// non-recording span (sampled out) collects nothing.
type requestSpan struct {
	span      trace.Span
	recording bool

	mu       sync.Mutex
	ended    bool
	name     string // the span's name once the method is known
	decision string
	attrs    []attribute.KeyValue // backed by buf
	buf      [maxRequestAttrs]attribute.KeyValue
}

// maxRequestAttrs is how many attributes a request's stages add at most
// (method, tenant, tier, tool, decision, rule, scope, degraded, denial
// cache, cache, upstream status, HTTP status); more (an unknown HTTP
// method's original) only costs a grow.
const maxRequestAttrs = 12

// add records attributes for the span's end.
func (rs *requestSpan) add(kv ...attribute.KeyValue) {
	rs.mu.Lock()
	if !rs.ended {
		rs.attrs = append(rs.attrs, kv...)
	}
	rs.mu.Unlock()
}

type requestSpanKey struct{}

// requestSpanFrom is ctx's server span, nil without one or when it is not
// recording.
func requestSpanFrom(ctx context.Context) *requestSpan {
	rs, _ := ctx.Value(requestSpanKey{}).(*requestSpan)
	if rs == nil || !rs.recording {
		return nil
	}
	return rs
}

// wrap runs next inside the request's server span; off, it is next.
func (t *tracing) wrap(next http.HandlerFunc) http.HandlerFunc {
	if t == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		method := httpMethod(r.Method)
		ctx, span := t.tracer.Start(ctx, serverSpanNames[method], serverSpan...)
		if !span.IsRecording() {
			// Sampled out: the context still carries the span, whose
			// (unsampled) traceparent goes upstream; nothing is recorded.
			next(w, r.WithContext(ctx))
			span.End()
			return
		}
		rs := &requestSpan{span: span, recording: true}
		rs.attrs = rs.buf[:0]
		if method != http.MethodPost {
			// Every MCP message is a POST, so the method is recorded only
			// for the others (a GET stream, a DELETE of a session).
			rs.attrs = append(rs.attrs, attrHTTPMethod.String(method))
		}
		if method == httpOther {
			rs.attrs = append(rs.attrs, attrHTTPMethodOrig.String(clip.String(r.Method, maxSpanString)))
		}
		sw := &statusWriter{ResponseWriter: w}
		next(sw, r.WithContext(context.WithValue(ctx, requestSpanKey{}, rs)))
		rs.end(sw.status)
	}
}

func (rs *requestSpan) end(status int) {
	if status == 0 {
		status = http.StatusOK // nothing written: net/http answers 200
	}
	rs.mu.Lock()
	rs.ended = true
	decision := rs.decision
	if decision == "" {
		decision = decisionOf(status)
	}
	attrs := append(rs.attrs, attrHTTPStatus.Int(status), attrDecision.String(decision))
	name := rs.name
	rs.mu.Unlock()
	if name != "" {
		rs.span.SetName(name)
	}
	rs.span.SetAttributes(attrs...)
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
		name = methodResponse
	}
	attrs := [4]attribute.KeyValue{attrMethod.String(clip.String(name, maxSpanString)), attrTenant.String(p.Tenant), attrTier.String(p.Tier)}
	n := 3
	if msg.ToolName != "" {
		attrs[n] = attrTool.String(clip.String(msg.ToolName, maxSpanString))
		n++
	}
	rs.mu.Lock()
	rs.name = spanName(serverSpanNames, name)
	rs.mu.Unlock()
	rs.add(attrs[:n]...)
}

// cache records a cacheable call's cache outcome (hit, miss, stale,
// coalesced, bypass) on its server span.
func (t *tracing) cache(ctx context.Context, outcome string) {
	if t == nil {
		return
	}
	if rs := requestSpanFrom(ctx); rs != nil {
		rs.add(attrCache.String(outcome))
	}
}

// serveUpstream is relayUpstream inside a client span: the upstream
// receives that span's traceparent (and tracestate), not the caller's.
func (g *Gateway) serveUpstream(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay) (int, error) {
	t := g.trace
	if t == nil {
		return relayUpstream(w, r, rt.proxy, fwd)
	}
	name := upstreamSpanNames[httpMethod(r.Method)]
	if fwd.Msg != nil && fwd.Msg.Method != "" {
		name = spanName(upstreamSpanNames, fwd.Msg.Method)
	}
	ctx, span := t.tracer.Start(r.Context(), name, clientSpan...)
	// fwd.Header is this request's own (identityHeaders makes it per
	// request), so the span's context goes straight into it.
	if fwd.Header == nil {
		fwd.Header = make(http.Header, 2)
	}
	fwd.Header["Tracestate"] = nil // replaces the caller's, unless the span has one
	t.prop.Inject(ctx, propagation.HeaderCarrier(fwd.Header))
	status, err := relayUpstream(w, r, rt.proxy, fwd)
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
		rs.add(attrUpstreamStatus.Int(status))
	}
	return status, err
}

// tracerOrNil is the engine's tracer: nil when tracing is off.
func (t *tracing) tracerOrNil() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}

// noteTrace records the engine's decision on the request's server span:
// the decision goes on at the end, once; its rule, degraded policy and
// denial-cache answer now, and for a denial the scope that denied it (the
// 429 body's scope). An admitting rule's scope is its configured per, which
// its name already identifies: every attribute costs each traced request
// about three allocations on export.
func noteTrace(ctx context.Context, d enforce.Decision) {
	rs := requestSpanFrom(ctx)
	if rs == nil {
		return
	}
	decision, rule, scope := d.Describe()
	attrs := make([]attribute.KeyValue, 0, 4)
	if rule != "" {
		attrs = append(attrs, attrRule.String(rule))
	}
	if scope != "" && decision != "admitted" {
		attrs = append(attrs, attrScope.String(scope))
	}
	if d.Degraded != "" {
		attrs = append(attrs, attrDegraded.String(string(d.Degraded)))
	}
	if d.FromDenialCache {
		attrs = append(attrs, attrDenialCache.Bool(true))
	}
	rs.mu.Lock()
	rs.decision = decision
	rs.mu.Unlock()
	rs.add(attrs...)
}
