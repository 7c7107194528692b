package metrics

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The environment variables that decide whether tracing is on and how
// spans leave the process. Everything else (headers, TLS, timeouts,
// compression, OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES) is read by the OpenTelemetry SDK and exporters
// themselves.
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envSDKDisabled    = "OTEL_SDK_DISABLED"
)

// OTLP protocols SetupTracing accepts (the names the OTel specification
// gives OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// ServiceName is the service.name of mcpgate's spans unless
// OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) says
// otherwise.
const ServiceName = "mcpgate"

// ErrTracingProtocol means OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL names a
// protocol mcpgate cannot export with (http/json is not supported by the Go
// exporters).
var ErrTracingProtocol = errors.New("unsupported OTLP protocol")

// provider is the tracer provider SetupTracing installed; nil while tracing is off.
var provider atomic.Pointer[sdktrace.TracerProvider]

// TracingEnabled reports whether the environment turns tracing on: an OTLP
// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
// is set and OTEL_SDK_DISABLED is not true.
func TracingEnabled() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv(envSDKDisabled)), "true") {
		return false
	}
	return os.Getenv(envEndpoint) != "" || os.Getenv(envTracesEndpoint) != ""
}

// TracingProtocol is the OTLP protocol the environment asks for: the
// traces-specific variable, else the general one, else http/protobuf.
func TracingProtocol() string {
	for _, k := range []string{envTracesProtocol, envProtocol} {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
	}
	return ProtocolHTTP
}

// SetupTracing turns tracing on when the environment asks for it (see
// TracingEnabled): an OTLP trace exporter (otlptracehttp for
// http/protobuf, otlptracegrpc for grpc), configured by the standard OTEL_*
// variables, behind a batch span processor, installed as the global tracer
// provider with the W3C trace-context propagator. Otherwise it creates
// nothing, TracerProvider stays nil and the returned shutdown does nothing:
// tracing off costs nothing.
//
// shutdown flushes the spans still queued and stops the exporter; call it
// once, after the server stopped, with a context bounding the flush. It is
// safe to call SetupTracing once per process.
func SetupTracing(ctx context.Context) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if !TracingEnabled() {
		return noop, nil
	}
	exp, err := newExporter(ctx, TracingProtocol())
	if err != nil {
		return noop, err
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", ServiceName)),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME wins over the default
	)
	if err != nil && res == nil {
		_ = exp.Shutdown(ctx)
		return noop, fmt.Errorf("tracing resource: %w", err)
	}
	// The sampler (OTEL_TRACES_SAMPLER, default parentbased_always_on) and
	// the batch settings (OTEL_BSP_*) come from the environment.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	provider.Store(tp)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func(ctx context.Context) error {
		provider.CompareAndSwap(tp, nil)
		return tp.Shutdown(ctx)
	}, nil
}

// TracerProvider is the provider SetupTracing installed, or nil while
// tracing is off (before SetupTracing, without an endpoint, or after
// shutdown).
func TracerProvider() trace.TracerProvider {
	if tp := provider.Load(); tp != nil {
		return tp
	}
	return nil
}

func newExporter(ctx context.Context, protocol string) (sdktrace.SpanExporter, error) {
	// Endpoint, headers, TLS, compression and timeout come from the
	// OTEL_EXPORTER_OTLP_* variables, which both exporters read themselves.
	switch protocol {
	case ProtocolHTTP:
		return otlptracehttp.New(ctx)
	case ProtocolGRPC:
		return otlptracegrpc.New(ctx)
	}
	return nil, fmt.Errorf("%w %q (use %s or %s)", ErrTracingProtocol, protocol, ProtocolHTTP, ProtocolGRPC)
}
