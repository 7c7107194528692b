package gateway

// Benchmarks of whole calls through the gateway (client, gateway and
// upstream in this process, over loopback HTTP). Run them without -race:
//
//	go test -run '^$' -bench 'BenchmarkMeteringOverhead|BenchmarkCacheHit|BenchmarkTracingOverhead' -benchtime 2000x -count 5 ./gateway/
//
// allocs/op and B/op count the whole process: client, gateway, upstream and
// background work such as the usage flusher.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// benchCall is one sequential call of a benchmark; it fails b unless the
// call succeeds as the benchmark expects.
type benchCall func(b testing.TB)

// benchPair runs subject b.N times. When peer is not nil, each iteration
// first makes one peer call with the timer stopped, so both run interleaved
// under the same load, and the ratios subject/peer of their median and mean
// times are reported as unit+"-p50" and unit+"-mean": a shared, busy machine
// moves absolute figures far more than it moves those ratios, the median's
// least. The order is fixed on purpose: the timer's stop and start each read
// MemStats (stopping the world) just before the peer's and the subject's
// call, which keeps the two symmetric; alternating the order measured a
// call against itself 10% apart.
func benchPair(b *testing.B, subject, peer benchCall, unit string) {
	b.ReportAllocs()
	for range 20 { // warm connections, caches and the store
		subject(b)
		if peer != nil {
			peer(b)
		}
	}
	var subjects, peers []time.Duration
	for b.Loop() {
		if peer != nil {
			b.StopTimer()
			start := time.Now()
			peer(b)
			peers = append(peers, time.Since(start))
			b.StartTimer()
		}
		start := time.Now()
		subject(b)
		subjects = append(subjects, time.Since(start))
	}
	if peer != nil {
		b.ReportMetric(ratio(subjects, peers, median), unit+"-p50")
		b.ReportMetric(ratio(subjects, peers, meanOf), unit+"-mean")
	}
}

func ratio(a, b []time.Duration, stat func([]time.Duration) time.Duration) float64 {
	return float64(stat(a)) / float64(stat(b))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func meanOf(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// rawCall POSTs body to url with client and checks the status and the
// X-Mcp-Cache header (cache "" checks nothing). It reads the whole answer
// but does not parse it, so the client costs little next to the server.
func rawCall(client *http.Client, url, tok, body, cache string) benchCall {
	return func(b testing.TB) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d %s", url, resp.StatusCode, got)
		}
		if src := resp.Header.Get("X-Mcp-Cache"); cache != "" && src != cache {
			b.Fatalf("%s: X-Mcp-Cache %q, want %q", url, src, cache)
		}
	}
}

// benchClient is a keep-alive client closed when b ends.
func benchClient(b *testing.B) *http.Client {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.Cleanup(c.CloseIdleConnections)
	return c
}

const meteringBenchConfig = `
usage: {flush_interval: 1s}
default_tier: free
tiers:
  free:
    monthly_quota: 1000000000
    limits:
      - {name: per_tenant, per: tenant, algorithm: token_bucket, limit: 1000000, period: 1s}
`

// BenchmarkMeteringOverhead: tools/call of echo through two gateways that
// differ only by Options.Usage (metering and its flusher on or off), on the
// memory store and on Redis. "on" reports on/off-p50 and on/off-mean, its
// median and mean times over those of the "off" gateway called interleaved
// with it.
func BenchmarkMeteringOverhead(b *testing.B) {
	for _, store := range []string{"memory", "redis"} {
		b.Run(store, func(b *testing.B) {
			s := setup{Config: meteringBenchConfig, Upstream: upstream.Options{JSONResponse: true, Stateless: true}}
			if store == "redis" {
				s.Redis = testenv.StartRedis(b, nil)
				s.Config += "store: {redis: \"@@REDIS@@\"}\n"
			}
			benchOnOff(b, s, func(s *setup) { s.Usage = openUsageDB(b, "") })
		})
	}
}

// benchOnOff runs "off" (a gateway of s) and "on" (one of s after turnOn)
// as benchPair's subject and peer: tools/call of echo, interleaved.
func benchOnOff(b *testing.B, s setup, turnOn func(*setup)) {
	off := newEnv(b, s)
	turnOn(&s)
	on := newEnv(b, s)
	tok := token(b, "acme", "alice")
	body := callBody(1, "echo", map[string]any{"text": "x"})
	client := benchClient(b)
	callOff := rawCall(client, off.mcpURL(0), tok, body, "")
	callOn := rawCall(client, on.mcpURL(0), tok, body, "")
	b.Run("off", func(b *testing.B) { benchPair(b, callOff, nil, "") })
	b.Run("on", func(b *testing.B) { benchPair(b, callOn, callOff, "on/off") })
}

// BenchmarkCacheHit: the cacheable search tool answered from the cache
// through the gateway (auth, limits, quota and breaker included) against the
// same call made directly to the upstream, per cache store. "hit" reports
// hit/direct-p50 and hit/direct-mean, its median and mean times over those of
// the direct call made interleaved with it.
func BenchmarkCacheHit(b *testing.B) {
	for _, m := range cacheModes {
		b.Run(m.name, func(b *testing.B) {
			s := setup{Config: cacheConfig, Upstream: jsonUpstream}
			if m.redis {
				s.CacheRedis = testenv.StartRedis(b, nil)
			}
			e := newEnv(b, s)
			tok := token(b, "acme", "alice")
			body := callBody(1, "search", map[string]any{"query": "bench"})
			client := benchClient(b)
			direct := rawCall(client, e.upURL, "", body, "")
			if r := post(b, e.mcpURL(0), tok, body, nil); r.Status != http.StatusOK || cacheSrc(r) != "miss" {
				b.Fatalf("first call: %d %s (X-Mcp-Cache %q)", r.Status, r.Body, cacheSrc(r))
			}
			hit := rawCall(client, e.mcpURL(0), tok, body, "hit")
			b.Run("direct", func(b *testing.B) { benchPair(b, direct, nil, "") })
			b.Run("hit", func(b *testing.B) { benchPair(b, hit, direct, "hit/direct") })
		})
	}
}

// BenchmarkTracingOverhead: tools/call of echo through two gateways that
// differ only by Options.TracerProvider: off, or an SDK provider (always
// sampled, batch span processor) exporting OTLP/HTTP to a receiver in this
// process that discards what it reads. "on" reports on/off-p50 and
// on/off-mean, its median and mean times over those of the untraced
// gateway called interleaved with it; allocs/op of "on" less those of
// "off" is what tracing allocates per call (export included).
func BenchmarkTracingOverhead(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	b.Cleanup(sink.Close)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(sink.URL+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	s := setup{Config: meteringBenchConfig, Upstream: upstream.Options{JSONResponse: true, Stateless: true}}
	benchOnOff(b, s, func(s *setup) { s.TracerProvider = tp })
}
