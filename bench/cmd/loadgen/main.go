// Command loadgen measures mcpgate end to end in one process: it starts the
// demo upstream, a bare httputil.ReverseProxy in front of it and gateways
// (memory store, Redis store) on loopback, drives them with concurrent
// keep-alive HTTP clients sending MCP tools/call requests, and prints calls/s
// and latency percentiles per target with the ratios against calling the
// upstream directly and, for the gateways, against the bare proxy. Targets are interleaved in
// rounds so that the drift of a shared machine spreads over all of them.
//
//	go run ./cmd/loadgen -workers 32,1 -rounds 5 -duration 3s
//
// Without -redis it starts its own redis-server (killed at exit); -redis
// none leaves the Redis targets out. -cpuprofile profiles the whole process
// (clients, gateways and upstream); samples carry pprof labels: server=NAME
// for the servers' handlers and client=TARGET for the load, so
//
//	go tool pprof -tagfocus server=gateway-mem loadgen.prof
//
// shows where the memory gateway's time goes.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/bench/internal/redisproc"
	"github.com/mcpgate/mcpgate/bench/loadgen"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run() error {
	workers := flag.String("workers", "32,1", "comma-separated worker counts; each is a full run")
	rounds := flag.Int("rounds", 3, "rounds per run (every target once per round)")
	duration := flag.Duration("duration", 3*time.Second, "counted window per target per round")
	warmup := flag.Duration("warmup", 500*time.Millisecond, "uncounted warm-up before each window")
	rules := flag.String("rules", loadgen.RulesLayered, "gateway rules: layered (2 tenant rules + 1 global) or single (1 tenant rule)")
	redisAddr := flag.String("redis", "", `redis-server host:port; "" starts one, "none" skips the Redis targets`)
	targets := flag.String("targets", "", "comma-separated targets (default all): direct, bare-proxy, gateway-mem, gateway-mem-traced (with -tracing), fed-1, fed-3 (with -federation), gateway-redis, deny-mem, deny-redis")
	tenants := flag.Int("tenants", 64, "tenants (tokens) the workers spread over")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memprofile := flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
	verbose := flag.Bool("v", false, "print every measurement as it is taken")
	tracing := flag.Bool("tracing", false, "add gateway-mem-traced: gateway-mem with OpenTelemetry tracing on, exporting OTLP/HTTP to a receiver in this process that discards; prints the traced/untraced ratio")
	federation := flag.Bool("federation", false, "add fed-1 and fed-3: gateway-mem fronting one, then three, upstreams (upstreams:); prints fed-3/fed-1")
	stdio := flag.Bool("stdio", false, "add stdio-direct and fed-stdio: the demo upstream over stdio, called directly and through a gateway; prints fed-stdio/stdio-direct")
	noUsage := flag.Bool("no-usage", false, "gateways without usage metering (by default each meters into its own SQLite store, as mcpgate serve does)")
	flag.Parse()

	var counts []int
	for f := range strings.SplitSeq(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-workers: %q is not a positive count", f)
		}
		counts = append(counts, n)
	}
	var only []string
	if *targets != "" {
		only = strings.Split(*targets, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	redisVersion := "not used"
	var redisCPU func() (time.Duration, error)
	addr := *redisAddr
	switch addr {
	case "none":
		addr = ""
	case "":
		srv, err := redisproc.Start()
		if err != nil {
			return err
		}
		defer srv.Stop()
		addr, redisVersion, redisCPU = srv.Addr, srv.Version, srv.CPU
	default:
		redisVersion = "external, " + addr
	}

	var stdioBin string
	if *stdio {
		dir, err := os.MkdirTemp("", "loadgen-stdio-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if stdioBin, err = loadgen.BuildStdioServer(ctx, dir); err != nil {
			return err
		}
	}
	env, err := loadgen.Start(ctx, &loadgen.Options{Stdio: stdioBin,
		Rules: *rules, RedisAddr: addr, Tenants: *tenants, RedisCPU: redisCPU, NoUsage: *noUsage, Tracing: *tracing, Federation: *federation,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return err
	}
	defer env.Close()
	if err := env.Exhaust(ctx); err != nil {
		return err
	}
	if err := env.Check(ctx); err != nil {
		return err
	}

	fmt.Printf("machine: %d CPUs (GOMAXPROCS %d), %s; %s; redis-server %s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel(), runtime.Version(), redisVersion)
	fmt.Printf("rules: %s; usage metering: %v; tool: echo; rounds %d x (%v warm-up + %v counted) per target\n",
		*rules, !*noUsage, *rounds, *warmup, *duration)

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memprofile != "" {
		defer func() {
			if err := writeAllocs(*memprofile); err != nil {
				fmt.Fprintln(os.Stderr, "loadgen:", err)
			}
		}()
	}
	for _, n := range counts {
		fmt.Printf("\n## %d concurrent client(s)\n\n", n)
		res, err := loadgen.Run(ctx, env, loadgen.RunOptions{
			Workers: n, Rounds: *rounds, Duration: *duration, Warmup: *warmup, Targets: only,
			Progress: func(round int, r loadgen.Result) {
				if *verbose {
					fmt.Fprintf(os.Stderr, "round %d %-14s %8.0f calls/s p50 %v p99 %v CPU/call %v redis CPU/call %v degraded %d\n",
						round, r.Target, r.PerSec(), r.P50, r.P99, r.CPUPerCall, r.RedisCPUPerCall, r.Degraded)
				}
			},
		})
		if err != nil {
			return err
		}
		res.Print(os.Stdout)
	}
	return nil
}

// writeAllocs writes the allocations made since the program started
// (go tool pprof -sample_index alloc_space).
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpuModel is the first model name of /proc/cpuinfo, or "unknown CPU".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
