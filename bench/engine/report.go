package engine

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
)

// Sample is one variant's result in one round.
type Sample struct {
	OpsPerSec   float64
	NsPerOp     int64
	AllocsPerOp int64
	BytesPerOp  int64
	// Extra holds the metrics the variant reported with b.ReportMetric
	// (MetricClientCPU, MetricServerCPU).
	Extra map[string]float64
}

// cpu is a sample's client plus server CPU per call in ns, 0 if not measured.
func (s Sample) cpu() float64 { return s.Extra[MetricClientCPU] + s.Extra[MetricServerCPU] }

// Rounds holds the samples of an interleaved run: Samples[name][round].
type Rounds struct {
	Order   []string
	Samples map[string][]Sample
}

// Interleave runs every variant once per round, in order, rounds times
// (A B C A B C ...), with testing.Benchmark (its duration is -test.benchtime,
// 1s by default). Interleaving spreads the drift of a shared machine over all
// variants instead of charging it to whichever ran last. progress, if not
// nil, is told each sample as it is taken. A variant that fails (b.Error)
// makes Interleave return an error.
func Interleave(rounds int, variants []Variant, progress func(round int, name string, s Sample)) (*Rounds, error) {
	out := &Rounds{Samples: make(map[string][]Sample, len(variants))}
	for _, v := range variants {
		out.Order = append(out.Order, v.Name)
	}
	for round := range rounds {
		for _, v := range variants {
			failed := false
			r := testing.Benchmark(func(b *testing.B) {
				v.Run(b)
				if b.Failed() {
					failed = true
				}
			})
			if failed || r.N == 0 {
				return nil, fmt.Errorf("engine: variant %s failed in round %d", v.Name, round+1)
			}
			s := Sample{
				OpsPerSec:   float64(r.N) / r.T.Seconds(),
				NsPerOp:     r.NsPerOp(),
				AllocsPerOp: r.AllocsPerOp(),
				BytesPerOp:  r.AllocedBytesPerOp(),
				Extra:       r.Extra,
			}
			out.Samples[v.Name] = append(out.Samples[v.Name], s)
			if progress != nil {
				progress(round+1, v.Name, s)
			}
		}
	}
	return out, nil
}

// Ratio compares two variants: Num's ops/s over Den's, per round.
type Ratio struct {
	Num, Den string
	// Target is the least acceptable median ratio; 0 means none.
	Target float64
}

// Values returns the per-round ratios.
func (r *Rounds) Values(q Ratio) []float64 {
	num, den := r.Samples[q.Num], r.Samples[q.Den]
	out := make([]float64, 0, min(len(num), len(den)))
	for i := range min(len(num), len(den)) {
		out = append(out, num[i].OpsPerSec/den[i].OpsPerSec)
	}
	return out
}

// CPUValues returns the per-round ratios of Den's CPU per call (client and
// server) over Num's: what Values would be on a machine that ran nothing
// else, once saturated. Empty when the variants report no CPU.
func (r *Rounds) CPUValues(q Ratio) []float64 {
	num, den := r.Samples[q.Num], r.Samples[q.Den]
	var out []float64
	for i := range min(len(num), len(den)) {
		if num[i].cpu() > 0 && den[i].cpu() > 0 {
			out = append(out, den[i].cpu()/num[i].cpu())
		}
	}
	return out
}

// Met reports whether the median ratio reaches q.Target (true without one).
func (r *Rounds) Met(q Ratio) bool {
	return q.Target == 0 || stats.Median(r.Values(q)) >= q.Target
}

// Print writes the per-variant medians and the ratios as Markdown tables.
// The CPU columns are the medians of the variants' MetricClientCPU and
// MetricServerCPU; CPU ratio is the median of CPUValues.
func (r *Rounds) Print(w io.Writer, ratios []Ratio) {
	rows := [][]string{{"variant", "median ops/s", "min ops/s", "max ops/s", "ns/op (median)", "allocs/op", "B/op",
		"client CPU us/op", "server CPU us/op"}}
	for _, name := range r.Order {
		ss := r.Samples[name]
		ops := make([]float64, len(ss))
		var client, server []float64
		for i, s := range ss {
			ops[i] = s.OpsPerSec
			if v, ok := s.Extra[MetricClientCPU]; ok {
				client = append(client, v)
			}
			if v, ok := s.Extra[MetricServerCPU]; ok {
				server = append(server, v)
			}
		}
		last := ss[len(ss)-1]
		rows = append(rows, []string{name, fmt.Sprintf("%.0f", stats.Median(ops)), fmt.Sprintf("%.0f", slices.Min(ops)),
			fmt.Sprintf("%.0f", slices.Max(ops)), fmt.Sprintf("%.0f", 1e9/stats.Median(ops)),
			fmt.Sprint(last.AllocsPerOp), fmt.Sprint(last.BytesPerOp), usOrDash(client), usOrDash(server)})
	}
	stats.WriteTable(w, rows)
	fmt.Fprintln(w)
	rows = [][]string{{"ratio (ops/s)", "median", "per round", "target", "met", "CPU ratio"}}
	for _, q := range ratios {
		vals := r.Values(q)
		per := make([]string, len(vals))
		for i, v := range vals {
			per[i] = fmt.Sprintf("%.2f", v)
		}
		target, met := "-", "-"
		if q.Target > 0 {
			target = fmt.Sprintf(">= %.2f", q.Target)
			met = "no"
			if r.Met(q) {
				met = "yes"
			}
		}
		cpu := "-"
		if c := r.CPUValues(q); len(c) > 0 {
			cpu = fmt.Sprintf("%.3f", stats.Median(c))
		}
		rows = append(rows, []string{q.Num + " / " + q.Den, fmt.Sprintf("%.3f", stats.Median(vals)), strings.Join(per, " "), target, met, cpu})
	}
	stats.WriteTable(w, rows)
}

// usOrDash is the median of ns values in µs, or "-" for none.
func usOrDash(ns []float64) string {
	if len(ns) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", stats.Median(ns)/1e3)
}
