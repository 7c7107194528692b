package loadgen

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Stdio targets (Options.Stdio): the demo upstream as a stdio process
// (bench/cmd/stdioserver), called directly by a go-sdk client over stdio
// (stdio-direct: one process, one session, the workers' calls in flight
// together on it), and through a gateway-mem whose upstreams: run the same
// command (fed-stdio, driven over HTTP like the other targets).
const (
	StdioDirect = "stdio-direct"
	FedStdio    = "fed-stdio"
)

// BuildStdioServer builds bench/cmd/stdioserver into dir and returns its
// path.
func BuildStdioServer(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "stdioserver")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/mcpgate/mcpgate/bench/cmd/stdioserver")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("loadgen: building the stdio server: %w", err)
	}
	return bin, nil
}

// stdioDriver returns the drive function of stdio-direct: a session to a
// process of bin, kept for the Env's life.
func (e *Env) stdioDriver(ctx context.Context, bin string) (func(context.Context, int, time.Duration, time.Duration) Result, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "loadgen", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: exec.Command(bin)}, nil)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %s: %w", StdioDirect, err)
	}
	e.closers = append(e.closers, func() { cs.Close() })
	return func(ctx context.Context, workers int, warmup, d time.Duration) Result {
		return driveSession(ctx, cs, workers, warmup, d)
	}, nil
}

// driveSession is Drive for an SDK session: workers concurrent callers of
// echo, closed loop.
func driveSession(ctx context.Context, cs *mcp.ClientSession, workers int, warmup, d time.Duration) Result {
	start := time.Now()
	from, to := start.Add(warmup), start.Add(warmup+d)
	lats := make([][]time.Duration, workers)
	errs := make([]int, workers)
	first := make([]string, workers)
	var cpu time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		sleepUntil(ctx, from)
		c0 := processCPU()
		sleepUntil(ctx, to)
		cpu = processCPU() - c0
	})
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(to) {
					return
				}
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}})
				lat := time.Since(t0)
				if t0.Before(from) {
					continue
				}
				if err == nil && res.IsError {
					err = fmt.Errorf("tool error")
				}
				if err != nil {
					if errs[w] == 0 {
						first[w] = err.Error()
					}
					errs[w]++
					continue
				}
				lats[w] = append(lats[w], lat)
			}
		})
	}
	wg.Wait()
	r := Result{Target: StdioDirect, Workers: workers, Window: d}
	var all []time.Duration
	for w := range workers {
		all = append(all, lats[w]...)
		r.Errors += errs[w]
		if r.FirstError == "" {
			r.FirstError = first[w]
		}
	}
	slices.Sort(all)
	r.Calls = len(all)
	r.P50, r.P90, r.P99 = stats.Percentile(all, 0.50), stats.Percentile(all, 0.90), stats.Percentile(all, 0.99)
	if r.Calls > 0 {
		r.CPUPerCall = cpu / time.Duration(r.Calls)
	}
	return r
}

// stdioConfig is the gateway config text with upstream.url replaced by one
// stdio upstream running bin, exposing bare names.
func stdioConfig(text, upURL, bin string) string {
	return replaceUpstream(text, upURL, fmt.Sprintf("upstream:\n  identity_headers: true\nupstreams:\n  - {name: s, command: [%q], prefix: \"\"}\n", bin))
}
