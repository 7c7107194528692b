package metrics

import (
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
)

// presetLabels creates the series of the counters alerted on, for every
// label value known in advance, at zero. A series born at 1 has no earlier
// sample, so rate() and increase() miss its first increment: without this
// the first breaker of a process, or its first failed flush, would never
// fire an alert.
func presetLabels(m *Metrics) {
	for _, r := range []string{limit.ReasonDenials, limit.ReasonFailures, limit.ReasonIdentical, limit.ReasonProbeFailed} {
		m.BreakersOpened.WithLabelValues(r)
	}
	for _, p := range []policy.FailurePolicy{policy.FailOpen, policy.FailClosed, policy.FailLocal} {
		m.Degraded.WithLabelValues(string(p))
	}
	for _, op := range []string{"flush", "sweep"} {
		m.UsageFlushFailures.WithLabelValues(op)
	}
}
