package enforce

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Store call spans. The decision's store request has its span
// ("mcpgate.admit", see limiter.admit); the calls made to the shared store
// after it, mostly while settling a call (Ticket.Done: releasing
// concurrency slots, correcting the cost charged, telling the loop
// breaker how the call ended), get one each, named "mcpgate.store <op>".
// A span is made only when the caller's span records: the background work
// (the usage flush, session renewals) has no caller to attach to, and a
// root span per flushed meter would be noise.

// storeSpan starts the span of one call to the shared store, or returns
// a nil span when there is none to make.
func (g *guardedStore) storeSpan(ctx context.Context, op string) (context.Context, trace.Span) {
	if g.tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	return g.tracer.Start(ctx, "mcpgate.store "+op, trace.WithSpanKind(trace.SpanKindClient))
}

// endStoreSpan ends s (nil: nothing to end), marking a failed call. The
// error's text stays out: it may quote keys, which name tenants and tools
// more precisely than the span's parent does.
func endStoreSpan(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.SetStatus(codes.Error, "store call failed")
	}
	s.End()
}
