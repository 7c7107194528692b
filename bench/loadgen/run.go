package loadgen

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
)

// RunOptions configures Run. Zero fields mean the documented defaults.
type RunOptions struct {
	// Workers is the number of concurrent clients; 0 means 32.
	Workers int
	// Rounds is how many times every target is measured; 0 means 3.
	Rounds int
	// Duration is the counted window of one measurement; 0 means 3s.
	Duration time.Duration
	// Warmup precedes every measurement, not counted; 0 means 500ms.
	Warmup time.Duration
	// Targets names the targets to measure, in Env order; nil means all.
	Targets []string
	// Progress, if set, sees every result as it is taken.
	Progress func(round int, r Result)
}

// Results holds the results of Run: Rounds[target][round].
type Results struct {
	Workers int
	Order   []string
	Rounds  map[string][]Result
}

// Run measures the targets of e interleaved, one after the other in each
// round (direct, bare-proxy, gateway-mem, gateway-redis, deny-mem,
// deny-redis, then the same in reverse, ...: see roundOrder), so that the
// drift of a shared machine spreads over all of them. A
// measurement with errors (a wrong status, a transport error) fails the run.
func Run(ctx context.Context, e *Env, o RunOptions) (*Results, error) {
	if o.Workers <= 0 {
		o.Workers = 32
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.Warmup <= 0 {
		o.Warmup = 500 * time.Millisecond
	}
	var targets []Target
	for _, t := range e.Targets {
		if o.Targets == nil || slices.Contains(o.Targets, t.Name) {
			targets = append(targets, t)
		}
	}
	for _, name := range o.Targets {
		if _, ok := e.Target(name); !ok {
			return nil, fmt.Errorf("loadgen: unknown target %q", name)
		}
	}
	res := &Results{Workers: o.Workers, Rounds: make(map[string][]Result)}
	for _, t := range targets {
		res.Order = append(res.Order, t.Name)
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, t := range roundOrder(targets, round) {
			r := Drive(ctx, t, o.Workers, o.Warmup, o.Duration)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if r.Errors > 0 || r.Calls == 0 {
				return nil, fmt.Errorf("loadgen: %s, round %d: %d calls, %d errors (first: %s)", t.Name, round, r.Calls, r.Errors, r.FirstError)
			}
			res.Rounds[t.Name] = append(res.Rounds[t.Name], r)
			if o.Progress != nil {
				o.Progress(round, r)
			}
		}
	}
	return res, nil
}

// roundOrder is the order of round's measurements: targets as given in odd
// rounds, reversed in even ones. Each target measured right after another
// pays for what that one left behind (its garbage for the collector, its
// idle connections, a warmer or colder cache); alternating the order puts
// each pair of neighbours both ways round, so a ratio of neighbours taken
// over an even number of rounds carries no position bias.
func roundOrder(targets []Target, round int) []Target {
	if round%2 == 1 {
		return targets
	}
	r := slices.Clone(targets)
	slices.Reverse(r)
	return r
}

// Targets of the gateway figures, from the issue.
const (
	// MinThroughputRatio is the least gateway/direct calls/s.
	MinThroughputRatio = 0.70
	// MaxAddedP50 is the most the gateway may add to the median latency.
	MaxAddedP50 = 500 * time.Microsecond
)

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/1e6) }

func medianDur(xs []time.Duration) time.Duration {
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	return time.Duration(stats.Median(f))
}

// ThroughputRatio returns the per-round ratios of target's calls/s to
// direct's.
func (r *Results) ThroughputRatio(target string) []float64 {
	var out []float64
	for i, x := range r.Rounds[target] {
		if i < len(r.Rounds[Direct]) {
			out = append(out, x.PerSec()/r.Rounds[Direct][i].PerSec())
		}
	}
	return out
}

// AddedP50 returns the per-round differences of target's p50 and direct's.
func (r *Results) AddedP50(target string) []time.Duration {
	return r.added(target, func(x Result) time.Duration { return x.P50 })
}

// Print writes the medians over rounds per target, then, when direct was
// measured, each target against direct, with the targets of the issue for
// the admitting gateways. When bare-proxy was measured, each admitting
// gateway is also set against it (printBare). CPU ratio is CPURatio. Columns: CPU/call is this process's CPU time per
// call (load generator, gateways and upstream together), redis CPU/call the
// redis-server's, degraded the limit decisions a gateway took without its
// store (summed over rounds; each one a call admitted under on_error: open).
func (r *Results) Print(w io.Writer) {
	rows := [][]string{{"target", "calls/s (median)", "calls/s min..max", "p50 ms", "p90 ms", "p99 ms",
		"CPU us/call", "redis CPU us/call", "degraded"}}
	for _, name := range r.Order {
		rs := r.Rounds[name]
		ops := make([]float64, len(rs))
		var p50, p90, p99, cpu, rcpu []time.Duration
		degraded := 0
		for i, x := range rs {
			degraded += x.Degraded
			ops[i] = x.PerSec()
			p50, p90, p99 = append(p50, x.P50), append(p90, x.P90), append(p99, x.P99)
			cpu, rcpu = append(cpu, x.CPUPerCall), append(rcpu, x.RedisCPUPerCall)
		}
		rows = append(rows, []string{name, fmt.Sprintf("%.0f", stats.Median(ops)),
			fmt.Sprintf("%.0f..%.0f", slices.Min(ops), slices.Max(ops)),
			ms(medianDur(p50)), ms(medianDur(p90)), ms(medianDur(p99)),
			us(medianDur(cpu)), us(medianDur(rcpu)), fmt.Sprint(degraded)})
	}
	stats.WriteTable(w, rows)
	r.printTracing(w)
	r.printFederation(w)
	defer r.printBare(w) // last, after the table against direct if any
	if _, ok := r.Rounds[Direct]; !ok || len(r.Order) < 2 {
		return
	}
	fmt.Fprintln(w)
	rows = [][]string{{"vs direct", "calls/s ratio (median)", "per round", fmt.Sprintf(">= %.2f", MinThroughputRatio),
		"added p50 ms (median)", "<= " + ms(MaxAddedP50) + " ms", "added p99 ms", "added CPU us/call", "CPU ratio"}}
	for _, name := range r.Order {
		if name == Direct {
			continue
		}
		ratios := r.ThroughputRatio(name)
		added99 := r.added(name, func(x Result) time.Duration { return x.P99 })
		addedCPU := r.added(name, func(x Result) time.Duration { return x.CPUPerCall + x.RedisCPUPerCall })
		okRatio, okP50 := "-", "-"
		if name == GatewayMem || name == GatewayRed {
			okRatio, okP50 = yesNo(stats.Median(ratios) >= MinThroughputRatio), yesNo(medianDur(r.AddedP50(name)) <= MaxAddedP50)
		}
		rows = append(rows, []string{name, fmt.Sprintf("%.3f", stats.Median(ratios)), perRound(ratios), okRatio,
			ms(medianDur(r.AddedP50(name))), okP50, ms(medianDur(added99)), us(medianDur(addedCPU)),
			fmt.Sprintf("%.3f", stats.Median(r.CPURatio(name)))})
	}
	stats.WriteTable(w, rows)
}

// CPURatio returns, per round, direct's CPU per call over target's (this
// process's and redis-server's): the throughput ratio a machine running
// only this benchmark would show once saturated. Unlike calls/s it does not
// move with what other tenants of a shared machine take.
func (r *Results) CPURatio(target string) []float64 {
	var out []float64
	for i, x := range r.Rounds[target] {
		if i < len(r.Rounds[Direct]) && x.CPUPerCall > 0 {
			d := r.Rounds[Direct][i]
			out = append(out, float64(d.CPUPerCall+d.RedisCPUPerCall)/float64(x.CPUPerCall+x.RedisCPUPerCall))
		}
	}
	return out
}

// added returns the per-round differences of f between target and direct.
func (r *Results) added(target string, f func(Result) time.Duration) []time.Duration {
	var out []time.Duration
	for i, x := range r.Rounds[target] {
		if i < len(r.Rounds[Direct]) {
			out = append(out, f(x)-f(r.Rounds[Direct][i]))
		}
	}
	return out
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/1e3) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// Met reports whether target meets both targets of the issue: median
// throughput ratio and median added p50.
func (r *Results) Met(target string) bool {
	return stats.Median(r.ThroughputRatio(target)) >= MinThroughputRatio && medianDur(r.AddedP50(target)) <= MaxAddedP50
}
