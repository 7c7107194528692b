package cache

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/internal/storespan"
)

// tracerName is the instrumentation scope of the cache's spans.
const tracerName = "github.com/mcpgate/mcpgate/cache"

// storeSpan starts the span of one store operation, "mcpgate.cache <op>"
// (read, lock, write, unlock, invalidate), as a child of ctx's span. The
// cache has no tracer of its own: it follows its caller's, whose span
// carries the provider, and makes a span only when that span records (a
// request the gateway traces; never background work) and the store does
// I/O (a RedisStore: an in-process operation is too cheap to time). It
// returns a nil span otherwise.
func (c *Cache) storeSpan(ctx context.Context, op string) (context.Context, trace.Span) {
	if !c.remote {
		return ctx, nil
	}
	return storespan.Start(ctx, nil, tracerName, "mcpgate.cache", op)
}

// endStoreSpan ends s (nil: nothing to end), marking a failed operation
// (a skipped one too: the store was not asked).
func endStoreSpan(s trace.Span, err error) {
	storespan.End(s, err, "cache store operation failed")
}
