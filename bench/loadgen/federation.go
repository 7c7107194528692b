package loadgen

import (
	"fmt"
	"io"
	"strings"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
)

// Federation targets (Options.Federation): gateway-mem's config with
// upstreams: instead of upstream.url. In both, echo is served by upstream
// "a" with prefix "" (so the calls are the same as the other targets');
// fed-3 has two more upstreams ("b__", "c__"), so that fed-3 / fed-1 is
// the cost of routing among several upstreams rather than one.
const (
	FedOne   = "fed-1"
	FedThree = "fed-3"
)

// federationConfig returns the gateway config text with upstream.url
// replaced by n upstreams, each a demo upstream of its own.
func federationConfig(text, upURL string, others []string) string {
	var b strings.Builder
	b.WriteString("upstream:\n  identity_headers: true\nupstreams:\n")
	fmt.Fprintf(&b, "  - {name: a, url: %q, prefix: \"\"}\n", upURL)
	for i, u := range others {
		name := string(rune('b' + i))
		fmt.Fprintf(&b, "  - {name: %s, url: %q}\n", name, u)
	}
	return replaceUpstream(text, upURL, b.String())
}

// replaceUpstream replaces the upstream section of the config text.
func replaceUpstream(text, upURL, with string) string {
	return strings.Replace(text, "upstream:\n  url: "+upURL+"\n  identity_headers: true\n", with, 1)
}

// addFederation adds fed-1 and fed-3, memory store, with their own demo
// upstreams for b and c.
func (e *Env) addFederation(add func(name, cfgText string) error, text, upURL string, others []string) error {
	if err := add(FedOne, federationConfig(text, upURL, nil)); err != nil {
		return err
	}
	return add(FedThree, federationConfig(text, upURL, others))
}

// pairRatio returns, per round, a's calls/s over b's.
func (r *Results) pairRatio(a, b string) []float64 {
	var out []float64
	bs := r.Rounds[b]
	for i, x := range r.Rounds[a] {
		if i < len(bs) && bs[i].PerSec() > 0 {
			out = append(out, x.PerSec()/bs[i].PerSec())
		}
	}
	return out
}

// printFederation writes fed-3 / fed-1 and fed-1 / gateway-mem when
// measured.
func (r *Results) printFederation(w io.Writer) {
	rows := [][]string{{"federation", "calls/s ratio (median)", "per round"}}
	for _, p := range [][2]string{{FedThree, FedOne}, {FedOne, GatewayMem}, {FedStdio, StdioDirect}} {
		if rs := r.pairRatio(p[0], p[1]); len(rs) > 0 {
			rows = append(rows, []string{p[0] + " / " + p[1], fmt.Sprintf("%.3f", stats.Median(rs)), perRound(rs)})
		}
	}
	if len(rows) == 1 {
		return
	}
	fmt.Fprintln(w)
	stats.WriteTable(w, rows)
}
