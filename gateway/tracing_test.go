package gateway

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/metrics"
)

// receiver is an OTLP trace receiver: it keeps the spans of every
// ExportTraceServiceRequest it is sent, over OTLP/HTTP (protobuf) or gRPC.
type receiver struct {
	collectorpb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (rc *receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			rc.spans = append(rc.spans, ss.GetSpans()...)
		}
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	req := &collectorpb.ExportTraceServiceRequest{}
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	resp, _ := rc.Export(r.Context(), req)
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (rc *receiver) all() []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]*tracepb.Span(nil), rc.spans...)
}

// startReceiver starts rc on loopback for protocol and returns the value of
// OTEL_EXPORTER_OTLP_ENDPOINT that reaches it.
func startReceiver(t *testing.T, rc *receiver, protocol string) string {
	t.Helper()
	if protocol == metrics.ProtocolHTTP {
		srv := httptest.NewServer(rc)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(s, rc)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return "http://" + ln.Addr().String()
}

func spanNamed(t *testing.T, spans []*tracepb.Span, name string) []*tracepb.Span {
	t.Helper()
	var out []*tracepb.Span
	for _, s := range spans {
		if s.GetName() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, kv := range s.GetAttributes() {
		m[kv.GetKey()] = anyValue(kv.GetValue())
	}
	return m
}

func anyValue(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	}
	return v.String()
}

// TestTracingExportsSpans turns tracing on through the OTEL_* environment
// (as mcpgate serve does), with a real OTLP receiver over each protocol,
// and checks the spans of an admitted and a denied tools/call: the server
// span is the child of the caller's traceparent, the admit span (a
// decision in Redis) and the upstream span are its children, the attributes say what the gateway decided, and
// the upstream got the upstream span's traceparent instead of the caller's.
func TestTracingExportsSpans(t *testing.T) {
	for _, protocol := range []string{metrics.ProtocolHTTP, metrics.ProtocolGRPC} {
		t.Run(protocol, func(t *testing.T) {
			rc := &receiver{}
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
			t.Setenv("OTEL_SDK_DISABLED", "")
			t.Setenv("OTEL_TRACES_SAMPLER", "")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", startReceiver(t, rc, protocol))
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
			shutdown, err := metrics.SetupTracing(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			tp := metrics.TracerProvider()
			if tp == nil {
				t.Fatal("tracing is off with OTEL_EXPORTER_OTLP_ENDPOINT set")
			}
			// On Redis: the admit span times a store call (an in-process
			// decision has none, see TestTracingInProcessDecisionHasNoAdmitSpan).
			e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, TracerProvider: tp,
				Redis: testenv.StartRedis(t, nil), Config: redisStore + `
tools:
  echo:
    limits:
      - {name: echo_once, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1h}
`})
			const clientTrace, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
			hdr := http.Header{"Traceparent": {"00-" + clientTrace + "-" + clientSpan + "-01"}, "Tracestate": {"vendor=1"}}
			tok := token(t, "acme", "alice")
			if r := post(t, e.mcpURL(0), tok, callBody(1, "echo", map[string]any{"text": "secret-argument"}), hdr); r.Status != http.StatusOK {
				t.Fatalf("admitted call: %d %s", r.Status, r.Body)
			}
			if r := post(t, e.mcpURL(0), tok, callBody(2, "echo", map[string]any{"text": "x"}), nil); r.Status != http.StatusTooManyRequests {
				t.Fatalf("denied call: %d %s", r.Status, r.Body)
			}
			// A GET without a session is refused, but still traced; its span
			// is the one that records the HTTP method.
			if r := get(t, e.mcpURL(0), tok); r.Status < 400 {
				t.Fatalf("GET without a session: %d %s", r.Status, r.Body)
			}
			if err := shutdown(context.Background()); err != nil { // flushes every span
				t.Fatal(err)
			}
			checkSpans(t, rc.all(), e.requests(), clientTrace, clientSpan)
			gets := spanNamed(t, rc.all(), "mcp GET")
			if len(gets) != 1 {
				t.Fatalf("%d spans named mcp GET, want 1", len(gets))
			}
			if a := attrs(gets[0]); a["http.request.method"] != http.MethodGet {
				t.Errorf("GET span: %v", a)
			}
		})
	}
}

func checkSpans(t *testing.T, spans []*tracepb.Span, seen []seenRequest, clientTrace, clientSpan string) {
	t.Helper()
	servers := spanNamed(t, spans, "mcp tools/call")
	if len(servers) != 2 {
		t.Fatalf("%d server spans named mcp tools/call, want 2 (spans: %v)", len(servers), spans)
	}
	var admitted, denied *tracepb.Span
	for _, s := range servers {
		if hex.EncodeToString(s.GetTraceId()) == clientTrace {
			admitted = s
		} else {
			denied = s
		}
	}
	if admitted == nil {
		t.Fatalf("no server span in the caller's trace %s", clientTrace)
	}
	if got := hex.EncodeToString(admitted.GetParentSpanId()); got != clientSpan {
		t.Errorf("server span's parent = %s, want the caller's span %s", got, clientSpan)
	}
	if admitted.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("server span kind %v", admitted.GetKind())
	}
	want := map[string]string{
		"mcp.method.name": "tools/call", "gen_ai.tool.name": "echo", "mcpgate.tenant": "acme",
		"mcpgate.decision": "admitted", "mcpgate.rule": "echo_once",
		"mcpgate.upstream.status": "200", "http.response.status_code": "200",
	}
	got := attrs(admitted)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("admitted server span %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if _, ok := got["mcpgate.tier"]; !ok {
		t.Errorf("admitted server span has no mcpgate.tier: %v", got)
	}
	for _, k := range []string{"mcpgate.scope", "http.request.method"} {
		if _, ok := got[k]; ok {
			t.Errorf("admitted POST's server span has %s (the rule names the scope; every MCP message is a POST): %v", k, got)
		}
	}
	for k, v := range got {
		if strings.Contains(v, "secret-argument") || strings.Contains(v, "Bearer") {
			t.Errorf("attribute %s records arguments or a token: %q", k, v)
		}
	}
	dg := attrs(denied)
	if dg["mcpgate.decision"] != "denied" || dg["mcpgate.rule"] != "echo_once" || dg["mcpgate.scope"] != "tenant_tool" || dg["http.response.status_code"] != "429" {
		t.Errorf("denied server span: %v", dg)
	}
	if _, ok := dg["mcpgate.upstream.status"]; ok {
		t.Errorf("denied call has an upstream status: %v", dg)
	}
	childOf := func(name string, parent *tracepb.Span) *tracepb.Span {
		t.Helper()
		for _, s := range spanNamed(t, spans, name) {
			if string(s.GetParentSpanId()) == string(parent.GetSpanId()) && string(s.GetTraceId()) == string(parent.GetTraceId()) {
				return s
			}
		}
		t.Fatalf("no span %q child of the server span", name)
		return nil
	}
	if a := attrs(childOf("mcpgate.admit", admitted)); a["mcpgate.decision"] != "admitted" {
		t.Errorf("admit span: %v", a)
	}
	if a := attrs(childOf("mcpgate.admit", denied)); a["mcpgate.decision"] != "denied" {
		t.Errorf("admit span of the denied call: %v", a)
	}
	up := childOf("upstream tools/call", admitted)
	if up.GetKind() != tracepb.Span_SPAN_KIND_CLIENT || attrs(up)["http.response.status_code"] != "200" {
		t.Errorf("upstream span: kind %v, %v", up.GetKind(), attrs(up))
	}
	wantParent := "00-" + clientTrace + "-" + hex.EncodeToString(up.GetSpanId()) + "-01"
	var calls int
	for _, r := range seen {
		if r.Method != http.MethodPost {
			continue
		}
		calls++
		if v := r.Header.Values("Traceparent"); len(v) != 1 || v[0] != wantParent {
			t.Errorf("upstream got traceparent %q, want the upstream span's %q", v, wantParent)
		}
		if v := r.Header.Get("Tracestate"); v != "vendor=1" {
			t.Errorf("upstream got tracestate %q, want the caller's vendor=1 carried by the span", v)
		}
	}
	if calls != 1 {
		t.Errorf("%d POSTs reached the upstream, want 1", calls)
	}
}

// TestTracingCacheOutcome: a cached tool's server spans say miss, then hit.
// The decisions are in process (memory store): no mcpgate.admit span, the
// decision is on the server span.
// traceToReceiver turns tracing on as mcpgate serve does (OTEL_* read by
// metrics.SetupTracing, default sampler), exporting OTLP/HTTP to a new
// receiver; shutdown flushes every span to it.
func traceToReceiver(t *testing.T) (*receiver, func(context.Context) error) {
	t.Helper()
	rc := &receiver{}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", startReceiver(t, rc, metrics.ProtocolHTTP)+"/v1/traces")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	shutdown, err := metrics.SetupTracing(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return rc, shutdown
}

func TestTracingCacheOutcome(t *testing.T) {
	rc, shutdown := traceToReceiver(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, TracerProvider: metrics.TracerProvider(), Config: `
tools:
  search:
    cache: {ttl: 10m}
`})
	searchTwice(t, e, shutdown)
	var outcomes []string
	for _, s := range spanNamed(t, rc.all(), "mcp tools/call") {
		outcomes = append(outcomes, attrs(s)["mcpgate.cache"])
		if d := attrs(s)["mcpgate.decision"]; d != "admitted" {
			t.Errorf("server span decision %q, want admitted", d)
		}
	}
	if n := len(spanNamed(t, rc.all(), "mcpgate.admit")); n != 0 {
		t.Errorf("%d mcpgate.admit spans for in-process decisions, want none", n)
	}
	if strings.Join(outcomes, ",") != "miss,hit" {
		t.Errorf("cache outcomes %v, want [miss hit]", outcomes)
	}
}

// TestTracingOff: without a tracer provider the gateway wraps nothing and
// the caller's traceparent reaches the upstream as it was sent.
func TestTracingOff(t *testing.T) {
	if newTracing(nil) != nil {
		t.Fatal("newTracing(nil) is not nil (off)")
	}
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	if e.gws[0].trace != nil {
		t.Fatal("tracing on without a tracer provider")
	}
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if r := post(t, e.mcpURL(0), token(t, "acme", "alice"), callBody(1, "echo", map[string]any{"text": "x"}), http.Header{"Traceparent": {tp}}); r.Status != http.StatusOK {
		t.Fatalf("call: %d %s", r.Status, r.Body)
	}
	for _, r := range e.requests() {
		if r.Method == http.MethodPost && r.Header.Get("Traceparent") != tp {
			t.Errorf("upstream got traceparent %q, want the caller's %q", r.Header.Get("Traceparent"), tp)
		}
	}
}

// TestTracingSampledOut: a caller's unsampled traceparent makes the default
// sampler (parentbased_always_on) record nothing, yet the upstream still
// receives the trace, unsampled, and the call is served as usual.
func TestTracingSampledOut(t *testing.T) {
	rc, shutdown := traceToReceiver(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, TracerProvider: metrics.TracerProvider()})
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	if r := post(t, e.mcpURL(0), token(t, "acme", "alice"), callBody(1, "echo", map[string]any{"text": "x"}), http.Header{"Traceparent": {"00-" + traceID + "-b7ad6b7169203331-00"}}); r.Status != http.StatusOK {
		t.Fatalf("call: %d %s", r.Status, r.Body)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if spans := rc.all(); len(spans) != 0 {
		t.Errorf("%d spans exported for an unsampled trace, want none", len(spans))
	}
	posts := 0
	for _, r := range e.requests() {
		if r.Method != http.MethodPost {
			continue
		}
		posts++
		tp := strings.Split(r.Header.Get("Traceparent"), "-")
		if len(tp) != 4 || tp[1] != traceID || tp[3] != "00" {
			t.Errorf("upstream got traceparent %q, want trace %s unsampled", r.Header.Get("Traceparent"), traceID)
		}
		if r.Header.Get("X-Mcp-Tenant") != "acme" {
			t.Errorf("upstream got X-Mcp-Tenant %q, want acme (identity headers kept)", r.Header.Get("X-Mcp-Tenant"))
		}
	}
	if posts == 0 {
		t.Fatal("no POST reached the upstream")
	}
}

// Names the client chooses reach a span cut to maxSpanString: a tool name
// or a method as long as the body limit would otherwise wait, whole, in the
// exporter's queue.
func TestTracingLongNames(t *testing.T) {
	rc, shutdown := traceToReceiver(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, TracerProvider: metrics.TracerProvider()})
	long := strings.Repeat("n", 1<<20)
	tok := sign(t, claims("acme", "alice", "tools:echo"))
	if r := post(t, e.mcpURL(0), tok, callBody(1, long, nil), nil); r.Status != http.StatusForbidden {
		t.Fatalf("tool outside the scopes: %d", r.Status)
	}
	body := `{"jsonrpc":"2.0","id":2,"method":"` + long + `","params":{}}`
	r := post(t, e.mcpURL(0), tok, body, nil)
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rc.all()
	if len(spans) < 2 {
		t.Fatalf("%d spans (the unknown method answered %d)", len(spans), r.Status)
	}
	for _, s := range spans {
		if len(s.Name) > len("upstream ")+maxSpanString {
			t.Errorf("span name of %d bytes", len(s.Name))
		}
		for k, v := range attrs(s) {
			if len(v) > maxSpanString {
				t.Errorf("span %.20s: attribute %s of %d bytes", s.Name, k, len(v))
			}
		}
	}
}

// The store calls around an admitted call have spans, children of the
// request's server span: the cache's read, lock and write on Redis, and the
// release of the call's concurrency slot when it is settled. A hit reads
// and releases only.
func TestTracingStoreSpans(t *testing.T) {
	rc, shutdown := traceToReceiver(t)
	redis := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, TracerProvider: metrics.TracerProvider(),
		Redis: redis, CacheRedis: redis, Config: redisStore + `
tools:
  search:
    cache: {ttl: 10m}
    limits:
      - {name: search_in_flight, per: tenant_tool, algorithm: concurrency, limit: 4, period: 1m}
`})
	searchTwice(t, e, shutdown)
	spans := rc.all()
	servers := spanNamed(t, spans, "mcp tools/call")
	if len(servers) != 2 {
		t.Fatalf("%d server spans, want 2", len(servers))
	}
	children := func(server *tracepb.Span) map[string]int {
		out := map[string]int{}
		for _, s := range spans {
			if string(s.GetParentSpanId()) == string(server.GetSpanId()) && string(s.GetTraceId()) == string(server.GetTraceId()) {
				out[s.GetName()]++
				if strings.HasPrefix(s.GetName(), "mcpgate.store ") || strings.HasPrefix(s.GetName(), "mcpgate.cache ") {
					if s.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
						t.Errorf("span %s kind %v, want client", s.GetName(), s.GetKind())
					}
				}
			}
		}
		return out
	}
	byOutcome := map[string]map[string]int{}
	for _, s := range servers {
		byOutcome[attrs(s)["mcpgate.cache"]] = children(s)
	}
	want := map[string]map[string]int{
		"miss": {"mcpgate.admit": 1, "mcpgate.cache read": 1, "mcpgate.cache lock": 1, "mcpgate.cache write": 1,
			"upstream tools/call": 1, "mcpgate.store release": 1},
		"hit": {"mcpgate.admit": 1, "mcpgate.cache read": 1, "mcpgate.store release": 1},
	}
	for outcome, w := range want {
		if got := byOutcome[outcome]; !maps.Equal(got, w) {
			t.Errorf("children of the %s's server span: %v, want %v", outcome, got, w)
		}
	}
}

// Behind upstreams:, the trace reaches the HTTP upstream that serves the
// call: its request carries the caller's trace id, with the gateway's
// upstream span as parent (the federation passes on the traceparent the
// gateway set on its hop).
func TestTracingFederatedUpstream(t *testing.T) {
	rc, shutdown := traceToReceiver(t)
	e := newFedEnv(t, fedSetup{TracerProvider: metrics.TracerProvider()})
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	hdr := http.Header{"Traceparent": {"00-" + clientTrace + "-" + clientSpan + "-01"}}
	before := len(e.a.seenTraceparents())
	if r := post(t, e.mcpURL(0), token(t, "acme", "alice"), callBody(1, "a__echo", map[string]any{"text": "x"}), hdr); r.Status != http.StatusOK {
		t.Fatalf("a__echo: %d %s", r.Status, r.Body)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	hops := spanNamed(t, rc.all(), "upstream tools/call")
	if len(hops) != 1 || hex.EncodeToString(hops[0].GetTraceId()) != clientTrace {
		t.Fatalf("%d upstream spans (want 1, in the caller's trace): %v", len(hops), hops)
	}
	want := "00-" + clientTrace + "-" + hex.EncodeToString(hops[0].GetSpanId()) + "-01"
	seen := e.a.seenTraceparents()[before:]
	if !slices.Contains(seen, want) {
		t.Fatalf("upstream a received traceparents %q, want %q (the gateway's upstream span)", seen, want)
	}
	for _, tp := range seen {
		if strings.Contains(tp, clientSpan) {
			t.Fatalf("upstream a received the caller's own span %q: the gateway's hop was skipped", tp)
		}
	}
}

// searchTwice calls the cached tool search twice with the same arguments
// (a miss, then a hit) and flushes the spans with shutdown.
func searchTwice(t *testing.T, e *env, shutdown func(context.Context) error) {
	t.Helper()
	tok := token(t, "acme", "alice")
	for i := range 2 {
		if r := post(t, e.mcpURL(0), tok, callBody(i, "search", map[string]any{"query": "q"}), nil); r.Status != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
		}
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A client choosing the HTTP method of its requests, without any token,
// must not choose the names of the gateway's spans: span names feed span
// metrics (Tempo's metrics-generator, the collector's spanmetrics
// connector), where each distinct name becomes a Prometheus series. A
// method HTTP does not define is "_OTHER", its original an attribute.
func TestTracingUnknownHTTPMethods(t *testing.T) {
	rc, shutdown := traceToReceiver(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, TracerProvider: metrics.TracerProvider()})
	const n = 40
	for i := range n {
		req, err := http.NewRequest(fmt.Sprintf("X%06d", i), e.mcpURL(0), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := do(req); err != nil { // no token at all
			t.Fatal(err)
		}
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	originals := map[string]bool{}
	for _, s := range rc.all() {
		names[s.GetName()] = true
		a := attrs(s)
		if a["http.request.method"] != "_OTHER" {
			t.Errorf("span %q: http.request.method %q, want _OTHER", s.GetName(), a["http.request.method"])
		}
		originals[a["http.request.method_original"]] = true
	}
	if want := map[string]bool{"mcp _OTHER": true}; !maps.Equal(names, want) {
		t.Fatalf("%d unauthenticated requests with made-up HTTP methods produced span names %v, want %v", n, slices.Sorted(maps.Keys(names)), slices.Sorted(maps.Keys(want)))
	}
	if len(originals) != n {
		t.Errorf("%d distinct http.request.method_original, want %d", len(originals), n)
	}
}

// Methods MCP does not define (an authenticated client chooses them) share
// one span name, on the server span and on the upstream's; the method
// itself is an attribute.
func TestTracingUnknownMCPMethods(t *testing.T) {
	rc, shutdown := traceToReceiver(t)
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, TracerProvider: metrics.TracerProvider()})
	tok := sign(t, claims("acme", "alice", "tools:echo"))
	const n = 20
	for i := range n {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"made/up%d","params":{}}`, i, i)
		post(t, e.mcpURL(0), tok, body, nil)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	methods := map[string]bool{}
	for _, s := range rc.all() {
		names[s.GetName()] = true
		if m, ok := attrs(s)["mcp.method.name"]; ok {
			methods[m] = true
		}
	}
	for name := range names {
		if name != "mcp other" && name != "upstream other" {
			t.Errorf("span %q: want mcp other or upstream other", name)
		}
	}
	if !names["mcp other"] {
		t.Errorf("no span named mcp other among %v", slices.Sorted(maps.Keys(names)))
	}
	if len(methods) != n {
		t.Errorf("%d distinct mcp.method.name, want %d", len(methods), n)
	}
}
