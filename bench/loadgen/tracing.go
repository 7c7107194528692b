package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
	"github.com/mcpgate/mcpgate/metrics"
)

// startTracing turns tracing on as `mcpgate serve` does (metrics.SetupTracing
// reading the OTEL_* environment), with OTEL_EXPORTER_OTLP_ENDPOINT set to
// an OTLP/HTTP receiver in this process that reads and discards every
// export. Env.Close flushes and stops it. Tracing is process-wide (the
// global tracer provider): one Env per process may use it.
func (e *Env) startTracing(ctx context.Context) (trace.TracerProvider, error) {
	url, err := e.server("otlp-receiver", http.HandlerFunc(discardExport))
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED"} {
		os.Unsetenv(k)
	}
	os.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url[:len(url)-len("/mcp")])
	shutdown, err := metrics.SetupTracing(ctx)
	if err != nil {
		return nil, fmt.Errorf("loadgen: tracing: %w", err)
	}
	e.closers = append(e.closers, func() { _ = shutdown(context.Background()) })
	return metrics.TracerProvider(), nil
}

// discardExport answers an OTLP/HTTP export with an empty
// ExportTraceServiceResponse (zero bytes in protobuf) after reading it.
func discardExport(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// MinTracingRatio is the least traced/untraced gateway calls/s the tracing
// work was asked to keep (tracing on may cost at most 3 %).
const MinTracingRatio = 0.97

// TracingRatio returns, per round, gateway-mem-traced's calls/s over
// gateway-mem's (measured one right after the other in each round).
func (r *Results) TracingRatio() []float64 {
	var out []float64
	off := r.Rounds[GatewayMem]
	for i, x := range r.Rounds[GatewayMemTraced] {
		if i < len(off) && off[i].PerSec() > 0 {
			out = append(out, x.PerSec()/off[i].PerSec())
		}
	}
	return out
}

// tracingCPURatio returns, per round, gateway-mem's CPU per call over
// gateway-mem-traced's: what tracing costs once the machine is saturated,
// less sensitive than calls/s to what other tenants take.
func (r *Results) tracingCPURatio() []float64 {
	var out []float64
	off := r.Rounds[GatewayMem]
	for i, x := range r.Rounds[GatewayMemTraced] {
		if i < len(off) && x.CPUPerCall > 0 {
			out = append(out, float64(off[i].CPUPerCall)/float64(x.CPUPerCall))
		}
	}
	return out
}

// printTracing writes the traced/untraced ratios when both were measured.
func (r *Results) printTracing(w io.Writer) {
	ratios := r.TracingRatio()
	if len(ratios) == 0 {
		return
	}
	per := make([]string, len(ratios))
	for i, v := range ratios {
		per[i] = fmt.Sprintf("%.3f", v)
	}
	fmt.Fprintln(w)
	stats.WriteTable(w, [][]string{
		{"tracing on vs off", "calls/s ratio (median)", "per round", fmt.Sprintf(">= %.2f", MinTracingRatio), "CPU ratio (median)"},
		{GatewayMemTraced + " / " + GatewayMem, fmt.Sprintf("%.3f", stats.Median(ratios)), strings.Join(per, " "),
			yesNo(stats.Median(ratios) >= MinTracingRatio), fmt.Sprintf("%.3f", stats.Median(r.tracingCPURatio()))},
	})
}
