package metrics

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// clearOTelEnv empties the OTEL_* variables SetupTracing reads and puts the
// global tracer provider back when the test ends: a test that
// turns tracing on installs one process-wide, and the next test (or the same
// one under -count) would see it.
func clearOTelEnv(t *testing.T) {
	tp := otel.GetTracerProvider()
	t.Cleanup(func() {
		if otel.GetTracerProvider() != tp {
			otel.SetTracerProvider(tp)
		}
	})
	for _, k := range []string{envEndpoint, envTracesEndpoint, envProtocol, envTracesProtocol, envSDKDisabled} {
		t.Setenv(k, "")
	}
}

// TestSetupTracingOff: without an OTLP endpoint nothing is created: no
// provider, the global tracer provider untouched.
func TestSetupTracingOff(t *testing.T) {
	clearOTelEnv(t)
	before := otel.GetTracerProvider()
	shutdown, err := SetupTracing(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if TracerProvider() != nil {
		t.Fatal("a tracer provider exists without OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if _, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider); sdk || otel.GetTracerProvider() != before {
		t.Fatal("the global tracer provider changed with tracing off")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestSetupTracingDisabled: OTEL_SDK_DISABLED=true wins over an endpoint.
func TestSetupTracingDisabled(t *testing.T) {
	clearOTelEnv(t)
	t.Setenv(envEndpoint, "http://127.0.0.1:4318")
	t.Setenv(envSDKDisabled, "TRUE")
	if TracingEnabled() {
		t.Fatal("tracing on with OTEL_SDK_DISABLED=true")
	}
}

// TestSetupTracingProtocol: the traces variable wins over the general one,
// http/protobuf is the default, and an unsupported protocol is an error.
func TestSetupTracingProtocol(t *testing.T) {
	clearOTelEnv(t)
	if p := TracingProtocol(); p != ProtocolHTTP {
		t.Fatalf("default protocol %q", p)
	}
	t.Setenv(envProtocol, "grpc")
	t.Setenv(envTracesProtocol, "http/json")
	t.Setenv(envTracesEndpoint, "http://127.0.0.1:4318/v1/traces")
	if _, err := SetupTracing(context.Background()); !errors.Is(err, ErrTracingProtocol) {
		t.Fatalf("http/json: err = %v, want ErrTracingProtocol", err)
	}
	if TracerProvider() != nil {
		t.Fatal("a provider after a failed setup")
	}
	t.Setenv(envTracesProtocol, "")
	shutdown, err := SetupTracing(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if TracerProvider() == nil {
		t.Fatal("no provider with an endpoint and protocol grpc")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if TracerProvider() != nil {
		t.Fatal("provider still set after shutdown")
	}
}
