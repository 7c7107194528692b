package loadgen

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
)

// BareProxy is the target of an httputil.ReverseProxy in front of the
// upstream, with no auth, limits or parsing: the cost of one HTTP hop, the
// limit any proxy in Go can reach on this setup.
const BareProxy = "bare-proxy"

// upstreamIdleConnsPerHost is the MaxIdleConnsPerHost of the upstream
// client mcp.NewProxy builds when given none (as `mcpgate serve` does); the
// bare proxy keeps as many idle upstream connections so that neither
// reopens connections the other keeps.
const upstreamIdleConnsPerHost = 64

// Targets of the gateway against the bare proxy, from the issue.
const (
	// MinBareRatio is the least gateway/bare-proxy calls/s.
	MinBareRatio = 0.95
	// MaxBareP99Ratio is the most gateway/bare-proxy p99 latency.
	MaxBareP99Ratio = 1.2
)

// newBareProxy returns a reverse proxy to upstream (an http(s) URL; its
// path is kept from the client's request, as both point at /mcp). Its
// transport is the gateway's upstream client's: http.DefaultTransport
// cloned with upstreamIdleConnsPerHost, compression left as the default
// (the transport asks for gzip, the demo upstream never compresses, so
// neither proxy decompresses anything). Proxy errors go to log and answer
// 502, which fails the run.
func newBareProxy(upstream string, log *slog.Logger) (*httputil.ReverseProxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("loadgen: bare proxy: %w", err)
	}
	base := &url.URL{Scheme: u.Scheme, Host: u.Host}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = upstreamIdleConnsPerHost
	return &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(base) },
		Transport: tr,
		ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelError),
	}, nil
}

// BareRatio returns, per round, target's calls/s over bare-proxy's.
func (r *Results) BareRatio(target string) []float64 {
	return r.vsBare(target, func(x, bare Result) (float64, bool) { return x.PerSec() / bare.PerSec(), bare.Calls > 0 })
}

// BareP99Ratio returns, per round, target's p99 over bare-proxy's.
func (r *Results) BareP99Ratio(target string) []float64 {
	return r.vsBare(target, func(x, bare Result) (float64, bool) { return float64(x.P99) / float64(bare.P99), bare.P99 > 0 })
}

// bareCPURatio returns, per round, bare-proxy's CPU per call (process and
// redis-server) over target's.
func (r *Results) bareCPURatio(target string) []float64 {
	return r.vsBare(target, func(x, bare Result) (float64, bool) {
		cpu := x.CPUPerCall + x.RedisCPUPerCall
		return float64(bare.CPUPerCall+bare.RedisCPUPerCall) / float64(cpu), cpu > 0
	})
}

// vsBare applies f to target's and bare-proxy's results of each round in
// which both were measured, keeping the values f reports defined (false: a
// zero denominator).
func (r *Results) vsBare(target string, f func(x, bare Result) (float64, bool)) []float64 {
	var out []float64
	bare := r.Rounds[BareProxy]
	for i, x := range r.Rounds[target] {
		if i >= len(bare) {
			break
		}
		if v, ok := f(x, bare[i]); ok {
			out = append(out, v)
		}
	}
	return out
}

// MetBare reports whether target meets both targets of the issue against
// the bare proxy: median calls/s ratio and median p99 ratio.
func (r *Results) MetBare(target string) bool {
	return stats.Median(r.BareRatio(target)) >= MinBareRatio && stats.Median(r.BareP99Ratio(target)) <= MaxBareP99Ratio
}

// printBare writes every admitting gateway against bare-proxy, when
// bare-proxy was measured.
func (r *Results) printBare(w io.Writer) {
	if _, ok := r.Rounds[BareProxy]; !ok {
		return
	}
	rows := [][]string{{"vs bare-proxy", "calls/s ratio (median)", "per round", fmt.Sprintf(">= %.2f", MinBareRatio),
		"p99 ratio (median)", "per round", fmt.Sprintf("<= %.2f", MaxBareP99Ratio), "added p99 ms", "CPU ratio"}}
	for _, name := range r.Order {
		if !strings.HasPrefix(name, "gateway-") {
			continue
		}
		calls, p99 := r.BareRatio(name), r.BareP99Ratio(name)
		var added []time.Duration
		for i, x := range r.Rounds[name] {
			if i < len(r.Rounds[BareProxy]) {
				added = append(added, x.P99-r.Rounds[BareProxy][i].P99)
			}
		}
		rows = append(rows, []string{name,
			fmt.Sprintf("%.3f", stats.Median(calls)), perRound(calls), yesNo(stats.Median(calls) >= MinBareRatio),
			fmt.Sprintf("%.3f", stats.Median(p99)), perRound(p99), yesNo(stats.Median(p99) <= MaxBareP99Ratio),
			ms(medianDur(added)), fmt.Sprintf("%.3f", stats.Median(r.bareCPURatio(name)))})
	}
	if len(rows) == 1 {
		return
	}
	fmt.Fprintln(w)
	stats.WriteTable(w, rows)
}

func perRound(xs []float64) string {
	s := make([]string, len(xs))
	for i, v := range xs {
		s[i] = fmt.Sprintf("%.2f", v)
	}
	return strings.Join(s, " ")
}
