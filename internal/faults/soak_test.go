package faults_test

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// soakDuration is 20s, or MCPGATE_SOAK (a Go duration, e.g. 3m).
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("MCPGATE_SOAK")
	if v == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("MCPGATE_SOAK=%q: want a positive duration such as 3m", v)
	}
	return d
}

// rssKiB reads this process's resident set (VmRSS) from /proc; 0 where
// there is no /proc.
func rssKiB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// Two gateways share one redis-server and one SQLite usage file, with
// limits, the result cache, the loop breaker and metering on, under as many
// calls as 24 callers on loopback can make, for 20s (or MCPGATE_SOAK). One
// tenant of eight is on a tier whose limit it keeps hitting: its 429s are
// the only non-200 answers allowed. Goroutines and RSS are sampled along the
// way and printed; goroutines must stay flat under load (no sample 100
// above the first) and fall once the load stops, none may outlive the test
// (goleak), RSS must not grow past a generous bound, and every
// admitted call must be metered exactly (durable usage == admitted calls,
// after the final flush).
func TestSoak(t *testing.T) {
	leakCheck(t)
	d := soakDuration(t)
	redis := testenv.StartRedis(t, nil)
	st, _ := sqliteUsage(t)
	e := newEnv(t, opts{Usage: st, Instances: 2, Config: `
store: {redis: "redis://` + redis.Addr + `", timeout: 250ms}
usage: {flush_interval: 1s}
breaker:
  consecutive_denials: 1000000
  consecutive_failures: 20
  identical_calls: {count: 1000000, within: 1m}
default_tier: pro
tiers:
  pro:
    limits:
      - {name: pro_rate, per: tenant, algorithm: token_bucket, limit: 100000000, period: 1m}
  tight:
    limits:
      # 10 per 5s: reached at 2 calls/s, which its 3 callers exceed even on
      # a machine so loaded that the whole soak makes 50 calls a second.
      - {name: tight_rate, per: tenant, algorithm: sliding_window_counter, limit: 10, period: 5s}
tools:
  echo:
    limits:
      - {name: echo_agent, per: subject_tool, algorithm: gcra, limit: 100000000, period: 1m}
  search:
    cache: {ttl: 2s}
`})
	tenants := make([]string, 8)
	toks := make([]string, 8)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("soak-%d", i)
		toks[i] = token(t, tenants[i], "agent")
	}
	// The last tenant is on the tight tier.
	toks[7] = tieredToken(t, tenants[7], "agent", "tight")

	sampleEvery := max(d/10, 2*time.Second)
	type sample struct {
		at         time.Duration
		goroutines int
		rssMiB     float64
		calls      int64
	}
	var series []sample
	var calls, limited atomic.Int64
	// The slowest answer per tool, and how many took over a second:
	// reported, not asserted (the client's 10s is the bound).
	var slowMu sync.Mutex
	slowest := map[string]time.Duration{}
	var overSecond atomic.Int64
	admitted := make([]atomic.Int64, len(tenants))
	var bad tally
	runtime.GC()
	startG, startRSS := runtime.NumGoroutine(), rssKiB()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ti := (w + n) % len(tenants)
				tool, args := "echo", map[string]any{"text": strconv.Itoa(n)}
				if n%3 == 0 {
					tool, args = "search", map[string]any{"query": strconv.Itoa(n % 16)}
				}
				r := e.call(w, toks[ti], tool, args, 10*time.Second)
				calls.Add(1)
				if r.Elapsed > time.Second {
					overSecond.Add(1)
				}
				slowMu.Lock()
				slowest[tool] = max(slowest[tool], r.Elapsed)
				slowMu.Unlock()
				switch k := kind(r); {
				case k == "ok":
					admitted[ti].Add(1)
				case k == "429" && ti == 7 && strings.Contains(string(r.Body), "tight_rate"):
					limited.Add(1)
				default:
					bad.add(tool + ":" + k + ":" + string(r.Body[:min(len(r.Body), 120)]))
				}
			}
		})
	}
	began := time.Now()
	for time.Since(began) < d {
		time.Sleep(min(sampleEvery, d-time.Since(began)))
		series = append(series, sample{time.Since(began).Round(time.Second), runtime.NumGoroutine(), float64(rssKiB()) / 1024, calls.Load()})
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(began)
	e.client.CloseIdleConnections()
	// Goroutines settle once the load stopped: what remains is the idle
	// keep-alive pools (gateway to upstream, both ways), which end with the
	// servers (leakCheck proves that after shutdown).
	time.Sleep(500 * time.Millisecond)
	runtime.GC()
	endG := runtime.NumGoroutine()
	endRSS := rssKiB()
	t.Logf("soak %v, 2 gateways, 1 redis-server, 24 callers: %d calls (%.0f/s), %d admitted, %d intended 429s",
		elapsed.Round(time.Second), calls.Load(), float64(calls.Load())/elapsed.Seconds(), sum(admitted), limited.Load())
	t.Logf("%8s %10s %8s %10s", "t", "goroutines", "RSS MiB", "calls")
	t.Logf("%8s %10d %8.1f %10d", "start", startG, float64(startRSS)/1024, 0)
	for _, s := range series {
		t.Logf("%8v %10d %8.1f %10d", s.at, s.goroutines, s.rssMiB, s.calls)
	}
	t.Logf("%8s %10d %8.1f %10s", "end", endG, float64(endRSS)/1024, "(idle)")
	t.Logf("slowest answer: echo %v, search %v; %d calls took over 1s",
		slowest["echo"].Round(time.Millisecond), slowest["search"].Round(time.Millisecond), overSecond.Load())
	for i, st := range e.stores {
		cs := st.Cache.Stats()
		t.Logf("gateway %d cache: %d hits, %d misses, %d coalesced, %d stale, %d refreshes, %d uncached, %d store errors, %d skipped (breaker open)",
			i, cs.Hits, cs.Misses, cs.Coalesced, cs.Stale, cs.Refreshes, cs.Uncached, cs.StoreErrors, cs.StoreSkipped)
	}
	if len(bad.kinds) > 0 {
		t.Errorf("answers other than 200 and the tight tenant's 429: %v", bad.String())
	}
	if limited.Load() == 0 {
		t.Error("the tight tenant was never limited: the load did not reach its limit")
	}
	// Flat: no sample far above the first, and fewer once the load stopped.
	first, peak := series[0].goroutines, 0
	for _, s := range series {
		peak = max(peak, s.goroutines)
	}
	if peak > first+100 || endG > first {
		t.Errorf("goroutines not flat: %d first under load, peak %d, %d after the load stopped", first, peak, endG)
	}
	if growth := float64(endRSS-startRSS) / 1024; startRSS > 0 && growth > 256 {
		t.Errorf("RSS grew by %.0f MiB", growth)
	}

	// Every admitted call is metered exactly once.
	e.stop(0)
	e.stop(1)
	period := usage.Period(time.Now())
	for i, tenant := range tenants {
		got := durable(t, st, tenant, period)
		if want := (limit.Usage{Charged: admitted[i].Load(), Calls: admitted[i].Load()}); got != want {
			t.Errorf("%s: durable %+v, admitted %d calls", tenant, got, admitted[i].Load())
		}
	}
}

func sum(a []atomic.Int64) int64 {
	var n int64
	for i := range a {
		n += a[i].Load()
	}
	return n
}
