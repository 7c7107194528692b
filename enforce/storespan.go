package enforce

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/internal/storespan"
)

// Store call spans. The decision's store request has its span
// ("mcpgate.admit", see limiter.admit); the calls made to the shared store
// after it, mostly while settling a call (Ticket.Done: releasing
// concurrency slots, correcting the cost charged, telling the loop
// breaker how the call ended), get one each, named "mcpgate.store <op>",
// under the caller's recording span only (package storespan).

// storeSpan starts the span of one call to the shared store, or returns
// a nil span when there is none to make.
func (g *guardedStore) storeSpan(ctx context.Context, op string) (context.Context, trace.Span) {
	if g.tracer == nil {
		return ctx, nil
	}
	return storespan.Start(ctx, g.tracer, "", "mcpgate.store", op)
}

// endStoreSpan ends s (nil: nothing to end), marking a failed call.
func endStoreSpan(s trace.Span, err error) {
	storespan.End(s, err, "store call failed")
}
