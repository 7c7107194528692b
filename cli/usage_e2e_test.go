package cli

// The usage path end to end, through the real binary: `go build` of
// cmd/mcpgate, `mcpgate usage init`, `mcpgate serve` processes sharing a real
// redis-server and an SQLite file, one of them killed with SIGKILL mid-load,
// the next one stopped with SIGTERM mid-load, and the figures read back with
// `mcpgate usage --json` and GET /admin/usage. The demo upstream runs in this
// process: its call counter is what was served.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	usagestore "github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

const (
	e2eSecret = "e2e-secret-0123456789abcdef0123456789"
	e2eAdmin  = "e2e-admin-token"
)

// buildMcpgate builds cmd/mcpgate into dir and returns the binary.
func buildMcpgate(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "mcpgate")
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.Missing(t, fmt.Sprintf("the go command is needed to build mcpgate: %v", err))
	}
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/mcpgate")
	cmd.Dir = ".." // the module root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/mcpgate: %v\n%s", err, out)
	}
	return bin
}

// gatewayProc is a running `mcpgate serve`.
type gatewayProc struct {
	cmd    *exec.Cmd
	stderr *testenv.SyncBuffer
	addr   string
	done   chan struct{} // closed when the process has exited
	err    error         // Wait's result, once done
}

func e2eEnv() []string {
	return append(os.Environ(), "E2E_SECRET="+e2eSecret, "E2E_ADMIN="+e2eAdmin)
}

// startServe starts `mcpgate serve --config cfg` and waits until it listens.
// The process is killed when the test ends if it is still running.
func startServe(t *testing.T, bin, cfg string) *gatewayProc {
	t.Helper()
	return startServeIn(t, bin, "", cfg)
}

// startServeIn is startServe in the working directory dir ("": this one).
func startServeIn(t *testing.T, bin, dir, cfg string) *gatewayProc {
	t.Helper()
	p := launchServe(t, bin, dir, cfg)
	deadline := time.After(10 * time.Second)
	for {
		if m := listening.FindStringSubmatch(p.stderr.String()); m != nil {
			p.addr = m[1]
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("mcpgate serve exited (%v):\n%s", p.err, p.stderr.String())
		case <-deadline:
			t.Fatalf("mcpgate serve did not start:\n%s", p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// launchServe starts `mcpgate serve --config cfg` in dir ("": this one)
// without waiting for it to listen (addr stays empty). The process is
// killed when the test ends if it is still running.
func launchServe(t *testing.T, bin, dir, cfg string) *gatewayProc {
	t.Helper()
	p := &gatewayProc{stderr: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "serve", "--config", cfg)
	p.cmd.Dir = dir
	p.cmd.Env = e2eEnv()
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// signal sends sig and waits for the process to exit.
func (p *gatewayProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("mcpgate did not exit after %v:\n%s", sig, p.stderr.String())
	}
}

// mcpgateCmd runs the binary to completion and returns its stdout.
func mcpgateCmd(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = e2eEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("mcpgate %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// load is the traffic of agents: workers calling echo (cost 1) and search
// (cost 3) on one gateway until stopped.
type load struct {
	ok, failed atomic.Int64 // answered 200; ended without an answer
	failedCost atomic.Int64
	stop       atomic.Bool
	wg         sync.WaitGroup
}

func startLoad(t *testing.T, addr, token string, workers int) *load {
	l := &load{}
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range workers {
		l.wg.Go(func() {
			for i := 0; !l.stop.Load(); i++ {
				tool, args, cost := "echo", `{"text":"x"}`, int64(1)
				if (w+i)%2 == 1 {
					tool, args, cost = "search", `{"query":"q"}`, 3
				}
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, i, tool, args)
				req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("MCP-Protocol-Version", "2025-06-18")
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				switch {
				case err != nil:
					// No answer: the gateway died or closed the
					// connection. The call may have been admitted (and
					// charged) without reaching the upstream.
					l.failed.Add(1)
					l.failedCost.Add(cost)
					if !l.stop.Load() {
						time.Sleep(5 * time.Millisecond) // the gateway is gone: do not spin
					}
				case resp.StatusCode == http.StatusOK:
					l.ok.Add(1)
				default:
					t.Errorf("%s: status %d", tool, resp.StatusCode)
				}
			}
		})
	}
	return l
}

func (l *load) halt() {
	l.stop.Store(true)
	l.wg.Wait()
}

// durableTotal reads the SQLite usage file as another process would.
func durableTotal(t *testing.T, db, tenant, period string) limit.Usage {
	t.Helper()
	st, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, _, err := st.Get(t.Context(), tenant, period)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Usage
}

// A gateway is killed with SIGKILL mid-load: the next instance's sweep
// writes what it had admitted and not flushed, so the durable total is what
// the upstream served (plus, at most, calls that died with the gateway
// between admission and the upstream). The next instance is stopped with
// SIGTERM mid-load: its final flush makes the durable total exactly what the
// upstream served. `mcpgate usage --json` and GET /admin/usage then print the
// same figures.
//
// Each gateway has its own upstream. The upstream counts a call when the MCP
// SDK dispatches it, asynchronously to the HTTP request that carried it: a
// call the killed gateway had forwarded may be counted a while after the
// kill, when the next gateway already serves. With one upstream such a call
// was counted in the next phase, which then looked as if it had served a
// call that was never charged.
func TestUsageSurvivesKillAndSIGTERM(t *testing.T) {
	start := time.Now()
	dir := t.TempDir()
	bin := buildMcpgate(t, dir)
	t.Logf("built mcpgate in %v", time.Since(start).Round(time.Millisecond))

	newUpstream := func() (*upstream.Server, string) {
		up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
		srv := httptest.NewServer(up.Handler())
		t.Cleanup(srv.Close)
		return up, srv.URL
	}
	upA, urlA := newUpstream() // gateway A's (killed)
	upB, urlB := newUpstream() // gateway B's (stopped with SIGTERM)
	served := func(up *upstream.Server) (calls, cost int64) {
		echo, search := up.Calls("echo"), up.Calls("search")
		return echo + search, echo + 3*search
	}
	r := testenv.StartRedis(t, nil)
	meters, err := redisstore.New(r.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "usage.db")
	config := func(name, upstreamURL, flush string) string {
		path := filepath.Join(dir, name)
		cfg := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
store: {redis: %q, timeout: 2s}
usage: {store: "sqlite:%s", flush_interval: %s}
auth:
  jwt: {hs256_secret_env: E2E_SECRET}
  admin_token_env: E2E_ADMIN
default_tier: free
tiers:
  free:
    monthly_quota: 1000000
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 1000000, period: 1m}
tools:
  search: {cost: 3}
`, upstreamURL, r.URL, db, flush)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A flushes often (part of its usage is durable when it dies); B only
	// sweeps at start and flushes when it stops.
	cfgA, cfgB := config("a.yaml", urlA, "100ms"), config("b.yaml", urlB, "1h")
	mcpgateCmd(t, bin, "usage", "init", "--config", cfgA)
	token, err := auth.SignHS256([]byte(e2eSecret), map[string]any{"tenant_id": "acme", "sub": "agent", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	period := usagestore.Period(time.Now())
	meterKey := keyspace.Usage("acme", period)
	liveMeter := func() limit.MeterState {
		st, ok, err := meters.ReadMeter(t.Context(), meterKey)
		if err != nil || !ok {
			t.Fatalf("read the live meter %s: found %v, %v", meterKey, ok, err)
		}
		return st
	}

	// Phase 1: SIGKILL mid-load.
	a := startServe(t, bin, cfgA)
	la := startLoad(t, a.addr, token, 8)
	deadline := time.Now().Add(5 * time.Second)
	for upA.TotalCalls() < 300 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	a.signal(t, syscall.SIGKILL)
	la.halt()
	calls1, cost1 := served(upA) // a lower bound: see the test's comment
	if calls1 < 100 || la.ok.Load() < 100 {
		t.Fatalf("only %d calls served (%d answered) before the kill", calls1, la.ok.Load())
	}
	before := durableTotal(t, db, "acme", period)
	t.Logf("killed mid-load: upstream served %d calls costing %d; %d calls answered, %d cut off (cost %d); durable before the next start: %+v",
		calls1, cost1, la.ok.Load(), la.failed.Load(), la.failedCost.Load(), before)

	// Phase 2: another instance starts; its sweep finds A's unflushed usage
	// and writes the live meter, which nothing charges any more, as it is.
	// (Waiting for the durable total to reach what the upstream served
	// instead could stop at a flush of A that covered the served calls but
	// not those charged after it and cut off by the kill.)
	b := startServe(t, bin, cfgB)
	var afterKill limit.Usage
	for end := time.Now().Add(10 * time.Second); ; {
		live := liveMeter().Live
		if afterKill = durableTotal(t, db, "acme", period); afterKill == live {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("durable total %+v 10s after the restart, live meter %+v, upstream served %d calls costing %d: usage of the killed gateway not swept",
				afterKill, live, calls1, cost1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Charged on admission: a call admitted in Redis whose gateway died
	// before it reached the upstream is charged but not served. Only calls
	// that got no answer can be such calls (and only they can be counted by
	// the upstream late, after served was read: either way the bounds hold).
	checkKilled := func(when string) {
		t.Helper()
		calls, cost := served(upA)
		extraCalls, extraCost := afterKill.NetCalls()-calls, afterKill.Used()-cost
		if extraCalls < 0 || extraCalls > la.failed.Load() || extraCost < 0 || extraCost > la.failedCost.Load() {
			t.Fatalf("%s: durable after the sweep %+v; upstream of the killed gateway served %d calls costing %d; %d calls (cost %d) were cut off by the kill",
				when, afterKill, calls, cost, la.failed.Load(), la.failedCost.Load())
		}
		t.Logf("%s: durable %d calls costing %d (served %d costing %d + %d calls / %d units admitted but cut off before the upstream)",
			when, afterKill.NetCalls(), afterKill.Used(), calls, cost, extraCalls, extraCost)
	}
	checkKilled("after the sweep")

	// GET /admin/usage on B and `mcpgate usage --json` agree.
	var cliReport, adminReport map[string]any
	if err := json.Unmarshal(mcpgateCmd(t, bin, "usage", "--config", cfgA, "--tenant", "acme", "--json"), &cliReport); err != nil {
		t.Fatal(err)
	}
	adminReport = adminUsage(t, b.addr, e2eAdmin, http.StatusOK)
	if !reflect.DeepEqual(cliReport, adminReport) {
		t.Fatalf("mcpgate usage --json:\n%v\nGET /admin/usage:\n%v", cliReport, adminReport)
	}
	for k, want := range map[string]any{"tenant": "acme", "period": period, "used": float64(afterKill.Used()), "quota": float64(1000000), "calls": float64(afterKill.NetCalls())} {
		if cliReport[k] != want {
			t.Fatalf("usage --json %s = %v, want %v (%v)", k, cliReport[k], want, cliReport)
		}
	}
	adminUsage(t, b.addr, "", http.StatusUnauthorized)
	adminUsage(t, b.addr, "not-the-admin-token", http.StatusUnauthorized)

	// Phase 3: SIGTERM mid-load: calls in flight finish, the final flush
	// writes them; nothing is cut off between admission and the upstream.
	lb := startLoad(t, b.addr, token, 8)
	for end := time.Now().Add(5 * time.Second); upB.TotalCalls() < 150 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	b.signal(t, syscall.SIGTERM)
	lb.halt()
	var exitErr *exec.ExitError
	if b.err != nil && !errors.As(b.err, &exitErr) {
		t.Fatal(b.err)
	}
	if b.err != nil {
		t.Fatalf("mcpgate serve exited with %v after SIGTERM:\n%s", b.err, b.stderr.String())
	}
	calls2, cost2 := served(upB)
	final := durableTotal(t, db, "acme", period)
	// Everything charged is durable (the final flush wrote the live meter),
	// and what B charged is what its upstream served.
	if live := liveMeter(); final != live.Live || !live.Flushed.Covers(live.Live) {
		t.Fatalf("after SIGTERM the durable total is %+v, the live meter %+v: the final flush missed usage\n%s", final, live, b.stderr.String())
	}
	if final.NetCalls()-afterKill.NetCalls() != calls2 || final.Used()-afterKill.Used() != cost2 {
		t.Fatalf("after SIGTERM the durable total grew by %d calls costing %d; the upstream served %d costing %d meanwhile\n%s",
			final.NetCalls()-afterKill.NetCalls(), final.Used()-afterKill.Used(), calls2, cost2, b.stderr.String())
	}
	if !strings.Contains(b.stderr.String(), "usage: final flush done") {
		t.Fatalf("no final flush in the log:\n%s", b.stderr.String())
	}
	t.Logf("SIGTERM mid-load: %d more calls served costing %d, all durable at exit; %d requests refused while stopping; whole test %v",
		calls2, cost2, lb.failed.Load(), time.Since(start).Round(time.Millisecond))
	// Seconds after the kill, whatever the killed gateway's upstream counted
	// late is counted.
	checkKilled("at the end")

	if err := json.Unmarshal(mcpgateCmd(t, bin, "usage", "--config", cfgB, "--tenant", "acme", "--period", period, "--json"), &cliReport); err != nil {
		t.Fatal(err)
	}
	if cliReport["used"] != float64(final.Used()) || cliReport["calls"] != float64(final.NetCalls()) {
		t.Fatalf("usage --json after the run = %v, want used %d calls %d", cliReport, final.Used(), final.NetCalls())
	}
}

// adminUsage calls GET /admin/usage?tenant=acme on addr with the bearer
// token (none when ""), expects status, and returns the JSON body.
func adminUsage(t *testing.T, addr, token string, status int) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/admin/usage?tenant=acme", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("GET /admin/usage with token %q: %d %s", token, resp.StatusCode, body)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("GET /admin/usage: %v: %s", err, body)
	}
	return m
}
