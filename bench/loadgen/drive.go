package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/bench/internal/stats"
)

// requestBody is the call every client sends: the demo upstream's echo
// tool, about the cheapest tool there is, so that the gateway's own cost
// shows.
var requestBody = []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`)

func newRequest(ctx context.Context, url, token string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(requestBody))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-06-18")
	req.Header.Set("Authorization", "Bearer "+token)
	return req, nil
}

// newClient returns a keep-alive client that holds one connection per
// worker.
func newClient(workers int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        workers,
		MaxIdleConnsPerHost: workers,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// Result is one target's figures over one measured window.
type Result struct {
	Target  string
	Workers int
	// Calls is the number of calls started in the window that got the
	// target's expected status; Errors counts the others (transport errors
	// and other statuses).
	Calls, Errors int
	// FirstError describes the first error, if any.
	FirstError string
	// Degraded is the number of the gateway's limit decisions taken without
	// its shared store during the run (warm-up included): calls admitted
	// under on_error: open because Redis failed or missed its deadline.
	Degraded int
	Window   time.Duration
	// Latency percentiles of the counted calls, from sending the request
	// to having read the whole answer.
	P50, P90, P99 time.Duration
	// CPUPerCall is the CPU time this process (load, gateways and upstream
	// alike) used during the window, per counted call: unlike calls/s it
	// does not depend on how much of the machine other tenants took.
	CPUPerCall time.Duration
	// RedisCPUPerCall is the redis-server's CPU time per counted call (0
	// when not measured).
	RedisCPUPerCall time.Duration
}

// PerSec is the throughput: counted calls per second of the window.
func (r Result) PerSec() float64 { return float64(r.Calls) / r.Window.Seconds() }

// Drive sends calls to t from workers concurrent clients, each waiting for
// its answer before sending the next (closed loop) over keep-alive
// connections, for warmup (not counted) then d (counted). Only calls
// started within the counted window are counted. ctx ends it early.
func Drive(ctx context.Context, t Target, workers int, warmup, d time.Duration) Result {
	if t.drive != nil {
		return t.drive(ctx, workers, warmup, d)
	}
	c := newClient(workers)
	defer c.CloseIdleConnections()
	var degraded0 float64
	if t.degraded != nil {
		degraded0 = t.degraded()
	}
	start := time.Now()
	from, to := start.Add(warmup), start.Add(warmup+d)
	type share struct {
		lat    []time.Duration
		errors int
		first  string
	}
	shares := make([]share, workers)
	var wg sync.WaitGroup
	// CPU used over the counted window, sampled at its edges.
	var cpu, redisCPU time.Duration
	wg.Go(func() {
		sample := func() (time.Duration, time.Duration) {
			var r time.Duration
			if t.redisCPU != nil {
				r, _ = t.redisCPU()
			}
			return processCPU(), r
		}
		sleepUntil(ctx, from)
		c0, r0 := sample()
		sleepUntil(ctx, to)
		c1, r1 := sample()
		cpu, redisCPU = c1-c0, r1-r0
	})
	labels := pprof.Labels("client", t.Name)
	for w := range workers {
		wg.Go(func() {
			pprof.Do(ctx, labels, func(ctx context.Context) {
				s := &shares[w]
				s.lat = make([]time.Duration, 0, 1<<14)
				tok := t.Tokens[w%len(t.Tokens)]
				for ctx.Err() == nil {
					t0 := time.Now()
					if !t0.Before(to) {
						return
					}
					status, err := send(ctx, c, t.URL, tok)
					lat := time.Since(t0)
					if t0.Before(from) {
						continue
					}
					if err == nil && status != t.Status {
						err = fmt.Errorf("status %d, want %d", status, t.Status)
					}
					if err != nil {
						if s.errors == 0 {
							s.first = err.Error()
						}
						s.errors++
						continue
					}
					s.lat = append(s.lat, lat)
				}
			})
		})
	}
	wg.Wait()
	r := Result{Target: t.Name, Workers: workers, Window: d}
	if t.degraded != nil {
		r.Degraded = int(t.degraded() - degraded0)
	}
	var all []time.Duration
	for _, s := range shares {
		all = append(all, s.lat...)
		r.Errors += s.errors
		if r.FirstError == "" {
			r.FirstError = s.first
		}
	}
	slices.Sort(all)
	r.Calls = len(all)
	r.P50, r.P90, r.P99 = stats.Percentile(all, 0.50), stats.Percentile(all, 0.90), stats.Percentile(all, 0.99)
	if r.Calls > 0 {
		r.CPUPerCall = cpu / time.Duration(r.Calls)
		r.RedisCPUPerCall = redisCPU / time.Duration(r.Calls)
	}
	return r
}

func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

// send makes one call and reads the whole answer.
func send(ctx context.Context, c *http.Client, url, token string) (int, error) {
	req, err := newRequest(ctx, url, token)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}
