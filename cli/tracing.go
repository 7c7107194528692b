package cli

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/mcpgate/mcpgate/metrics"
)

// tracingFlushTimeout bounds the flush of queued spans at shutdown: a
// collector that is down must not hold the process.
const tracingFlushTimeout = 5 * time.Second

// setupTracing turns OpenTelemetry tracing on when the OTEL_* environment
// asks for it (see metrics.SetupTracing). The returned func flushes the
// queued spans; call it after the gateway stopped.
func setupTracing(ctx context.Context, log *slog.Logger) (func(), error) {
	shutdown, err := metrics.SetupTracing(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if metrics.TracerProvider() != nil {
		log.Info("tracing on: exporting spans over OTLP", "protocol", metrics.TracingProtocol())
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("tracing: flushing spans at shutdown failed", "err", err)
		}
	}, nil
}
