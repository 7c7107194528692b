// Package storespan times one call to a store (the limit store, the
// result cache) as a client span, child of the caller's span. A span is
// made only when the caller's span records: background work (the usage
// flush, session renewals) has no caller to attach to, and a root span per
// such call would be noise. The error's text stays out of the span: it may
// quote keys, which name tenants and tools.
package storespan

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Start starts the span "kind op" (e.g. "mcpgate.store refund") under
// ctx's span when that span records, with tracer, or when tracer is nil
// with the tracer of scope from the span's own provider. Otherwise it
// returns ctx and a nil span, having built nothing: the name is made only
// for a span that records.
func Start(ctx context.Context, tracer trace.Tracer, scope, kind, op string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	if tracer == nil {
		tracer = parent.TracerProvider().Tracer(scope)
	}
	return tracer.Start(ctx, kind+" "+op, trace.WithSpanKind(trace.SpanKindClient))
}

// End ends s (nil: nothing to end), with an error status described by
// failed when err is not nil.
func End(s trace.Span, err error, failed string) {
	if s == nil {
		return
	}
	if err != nil {
		s.SetStatus(codes.Error, failed)
	}
	s.End()
}
