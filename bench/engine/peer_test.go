package engine

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
	"github.com/mcpgate/mcpgate/bench/internal/toolhive/ratelimit"
	"github.com/mcpgate/mcpgate/limit"
)

func BenchmarkPeer(b *testing.B) {
	r := startRedis(b)
	for _, v := range append(r.PeerVariants(), r.SingleVariants()...) {
		b.Run(v.Name, v.Run)
	}
}

// TestPeerReport runs mcpgate and ToolHive interleaved and prints medians
// and ratios:
//
//	go test ./engine -run TestPeerReport -v -rounds 9 -test.benchtime 1s
func TestPeerReport(t *testing.T) {
	n := reportRounds(t)
	r := startRedis(t)
	progress := func(round int, name string, s Sample) {
		t.Logf("round %d %-28s %12.0f ops/s %8.2f server-us/op %8.2f p50-us", round, name, s.OpsPerSec,
			s.Extra[MetricServerCPU]/1e3, s.Extra[MetricP50]/1e3)
	}
	res, err := Interleave(n, r.PeerVariants(), progress)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	procs := runtime.GOMAXPROCS(0)
	b.WriteString("Peer variants: " + strconv.Itoa(Parallelism()) + " goroutines x GOMAXPROCS " + strconv.Itoa(procs) +
		" = " + strconv.Itoa(Parallelism()*procs) + " concurrent callers\n\n")
	res.Print(&b, []Ratio{
		{Num: PeerStore, Den: PeerToolHive, Target: 1.5},
		{Num: PeerStore3, Den: PeerToolHive3, Target: 1.5},
		{Num: PeerStore, Den: PeerStoreScript},
		{Num: PeerStore3, Den: PeerStore3Script},
		{Num: PeerStore3, Den: PeerStore3TwoTrips},
		{Num: PeerToolHiveScript, Den: PeerToolHive},
	})
	b.WriteString("\nredis-server CPU per decision, peer's over ours (>= 1: ours costs the server no more):\n\n")
	printMetricRatios(&b, res, MetricServerCPU, []Ratio{
		{Num: PeerStore, Den: PeerToolHiveScript, Target: 1},
		{Num: PeerStore3, Den: PeerToolHive3Raw, Target: 1},
		{Num: PeerStore, Den: PeerToolHive},
		{Num: PeerStore3, Den: PeerToolHive3},
		{Num: PeerStore, Den: PeerStoreScript},
		{Num: PeerStore3, Den: PeerStore3Script},
	})
	os.Stdout.WriteString("\n" + b.String() + "\n")

	single, err := Interleave(n, r.SingleVariants(), progress)
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	b.WriteString("One caller, layered: median latency (p50) per round, peer's over ours (>= 1: ours no slower)\n\n")
	printMetricRatios(&b, single, MetricP50, []Ratio{{Num: SingleStore3, Den: SingleToolHive3, Target: 1}})
	os.Stdout.WriteString("\n" + b.String() + "\n")
}

// printMetricRatios prints, per ratio, the medians of metric on both sides
// and the median over rounds of Den's metric over Num's (lower is better
// for the metric, so a ratio above 1 favours Num).
func printMetricRatios(b *strings.Builder, r *Rounds, metric string, ratios []Ratio) {
	rows := [][]string{{"ratio (" + metric + ")", "num median", "den median", "median den/num", "per round", "target", "met"}}
	for _, q := range ratios {
		num, den := r.Samples[q.Num], r.Samples[q.Den]
		var vals, nv, dv []float64
		per := []string{}
		for i := range min(len(num), len(den)) {
			n, d := num[i].Extra[metric], den[i].Extra[metric]
			nv, dv = append(nv, n), append(dv, d)
			if n > 0 {
				vals = append(vals, d/n)
				per = append(per, fmt.Sprintf("%.2f", d/n))
			}
		}
		target, met := "-", "-"
		if q.Target > 0 {
			target = fmt.Sprintf(">= %.2f", q.Target)
			met = "no"
			if stats.Median(vals) >= q.Target {
				met = "yes"
			}
		}
		rows = append(rows, []string{q.Num + " / " + q.Den, fmt.Sprintf("%.2f us", stats.Median(nv)/1e3),
			fmt.Sprintf("%.2f us", stats.Median(dv)/1e3), fmt.Sprintf("%.3f", stats.Median(vals)), strings.Join(per, " "), target, met})
	}
	stats.WriteTable(b, rows)
}

// TestPeersAgree holds mcpgate and ToolHive to the same decisions on small
// limits, so that the peer variants compare the same logical work: one
// bucket, and three buckets (one shared by every caller) all-or-nothing.
func TestPeersAgree(t *testing.T) {
	r := startRedis(t)
	ctx := context.Background()
	const refill = time.Hour // nothing refills during the test
	small := func(name string, n int64) limit.Rule {
		return limit.Rule{Name: name, Algorithm: limit.TokenBucket, Limit: n, Period: refill}
	}
	t.Run("one", func(t *testing.T) {
		l, err := ratelimit.NewLimiter(r.GoRedis, "agree", "one", ToolHiveConfig("", 3, refill, true))
		if err != nil {
			t.Fatal(err)
		}
		checks := []limit.Check{{Rule: small("tenant", 3), Key: Key("agree-one")}}
		for i := range 5 {
			d, err := r.Store.Take(ctx, checks, 1)
			if err != nil {
				t.Fatal(err)
			}
			p, err := l.Allow(ctx, "", "alice")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != p.Allowed || d.Allowed != (i < 3) {
				t.Fatalf("call %d: mcpgate %v, ToolHive %v, want %v", i+1, d.Allowed, p.Allowed, i < 3)
			}
		}
	})
	t.Run("layered", func(t *testing.T) {
		// every bucket holds 4: alice's 4 calls are all admitted; bob's
		// first is denied by the shared/global bucket, which alice used up,
		// and charges none of bob's own buckets.
		l, err := ratelimit.NewLimiter(r.GoRedis, "agree", "layered", ToolHiveConfig("search", 4, refill, false))
		if err != nil {
			t.Fatal(err)
		}
		rule := small("r", 4)
		for _, who := range []string{"alice", "alice", "alice", "alice", "bob", "bob"} {
			req := LayeredRequest("agree", "agree-"+who, "search", rule, rule, rule)
			o, err := r.Store.Evaluate(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			p, err := l.Allow(ctx, "search", who)
			if err != nil {
				t.Fatal(err)
			}
			if o.Decision.Allowed != p.Allowed || o.Decision.Allowed != (who == "alice") {
				t.Fatalf("%s: mcpgate %v, ToolHive %v, want %v", who, o.Decision.Allowed, p.Allowed, who == "alice")
			}
		}
		// bob's own buckets were not charged by the denials
		o, err := r.Store.Take(ctx, LayeredRequest("agree", "agree-bob", "search", rule, rule, rule).Checks, 1)
		if err != nil || !o.Allowed || o.Results[0].Remaining != 3 {
			t.Fatalf("bob's own buckets after two denials: %+v, %v; want 3 left", o, err)
		}
	})
	t.Run("raw scripts", func(t *testing.T) {
		th := rueidis.NewLuaScript(ratelimit.ConsumeAllSource())
		keys, args := ratelimit.BucketArgs("agree-raw", "srv", []string{"shared", "user:a", "user-tool:search:a"}, 2, refill)
		for i := range 3 {
			v, err := th.Exec(ctx, r.Rueidis, keys, args).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if (v == 0) != (i < 2) {
				t.Fatalf("call %d: ToolHive's script through rueidis returned %d", i+1, v)
			}
		}
	})
}
