package loadgen

import (
	"context"
	"net/http"
	"net/http/httputil"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

func startEnv(t *testing.T, rules string) *Env {
	t.Helper()
	srv := testenv.StartRedis(t, nil)
	return readyEnv(t, &Options{Rules: rules, RedisAddr: srv.Addr, Tenants: 4})
}

// readyEnv starts an Env of opts whose targets answer as they must.
func readyEnv(t *testing.T, opts *Options) *Env {
	t.Helper()
	e, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	if err := e.Exhaust(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRun drives every target briefly: each answers every call with its
// expected status (Run fails otherwise), and the report names them all.
func TestRun(t *testing.T) {
	for _, rules := range []string{RulesLayered, RulesSingle} {
		t.Run(rules, func(t *testing.T) {
			e := startEnv(t, rules)
			var names []string
			for _, tg := range e.Targets {
				names = append(names, tg.Name)
			}
			if want := []string{Direct, BareProxy, GatewayMem, GatewayRed, DenyMem, DenyRedis}; strings.Join(names, " ") != strings.Join(want, " ") {
				t.Fatalf("targets %v, want %v", names, want)
			}
			res, err := Run(context.Background(), e, RunOptions{Workers: 4, Rounds: 1, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range names {
				r := res.Rounds[name][0]
				if r.Calls == 0 || r.Errors != 0 || r.P50 <= 0 || r.P99 < r.P50 {
					t.Errorf("%s: %+v", name, r)
				}
			}
			var b strings.Builder
			res.Print(&b)
			for _, name := range names {
				if !strings.Contains(b.String(), "| "+name+" ") {
					t.Errorf("report lacks %s:\n%s", name, b.String())
				}
			}
			if !strings.Contains(b.String(), "| vs bare-proxy ") {
				t.Errorf("report lacks the bare-proxy table:\n%s", b.String())
			}
		})
	}
}

// TestDriveCountsWrongStatus holds Drive to its contract: a call that does
// not get the expected status is an error, not a counted call.
func TestDriveCountsWrongStatus(t *testing.T) {
	e := startEnv(t, RulesSingle)
	tg, ok := e.Target(GatewayMem)
	if !ok {
		t.Fatal("no gateway-mem target")
	}
	tg.Status = http.StatusTooManyRequests // it answers 200
	r := Drive(context.Background(), tg, 2, 0, 100*time.Millisecond)
	if r.Calls != 0 || r.Errors == 0 || !strings.Contains(r.FirstError, "status 200") {
		t.Fatalf("got %+v, want only errors", r)
	}
	if _, err := Run(context.Background(), e, RunOptions{Targets: []string{"nope"}}); err == nil {
		t.Fatal("Run accepted an unknown target")
	}
}

func TestStartRejectsUnknownRules(t *testing.T) {
	if _, err := Start(context.Background(), &Options{Rules: "bogus"}); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("err = %v", err)
	}
}

// TestBareRatios pairs each round of a gateway with the same round of
// bare-proxy, and the table lists the admitting gateways only.
func TestBareRatios(t *testing.T) {
	round := func(calls int, p99 time.Duration) Result {
		return Result{Calls: calls, Window: time.Second, P99: p99, CPUPerCall: time.Millisecond}
	}
	r := &Results{Order: []string{Direct, BareProxy, GatewayRed, DenyRedis}, Rounds: map[string][]Result{
		Direct:     {round(1200, time.Millisecond), round(1200, time.Millisecond)},
		BareProxy:  {round(1000, 10*time.Millisecond), round(500, 20*time.Millisecond)},
		GatewayRed: {round(900, 15*time.Millisecond), round(500, 20*time.Millisecond)},
		DenyRedis:  {round(5000, time.Millisecond), round(5000, time.Millisecond)},
	}}
	if got := r.BareRatio(GatewayRed); len(got) != 2 || got[0] != 0.9 || got[1] != 1 {
		t.Errorf("BareRatio = %v, want [0.9 1]", got)
	}
	if got := r.BareP99Ratio(GatewayRed); len(got) != 2 || got[0] != 1.5 || got[1] != 1 {
		t.Errorf("BareP99Ratio = %v, want [1.5 1]", got)
	}
	if r.MetBare(GatewayRed) { // medians 0.95 and 1.25: p99 misses
		t.Error("MetBare with a median p99 ratio of 1.25")
	}
	var b strings.Builder
	r.Print(&b)
	out := strings.Join(strings.Fields(b.String()), " ") // table cells unpadded
	i := strings.Index(out, "| vs bare-proxy ")
	if i < 0 {
		t.Fatalf("no bare-proxy table:\n%s", b.String())
	}
	table := out[i:]
	if !strings.Contains(table, "| gateway-redis | 0.950 | 0.90 1.00 | yes | 1.250 | 1.50 1.00 | no |") {
		t.Errorf("bare-proxy table:\n%s", b.String())
	}
	if strings.Contains(table, DenyRedis) || strings.Contains(table, "| "+BareProxy+" |") {
		t.Errorf("bare-proxy table lists a non-gateway target:\n%s", b.String())
	}
}

// TestBareProxyIsTransparent holds bare-proxy to being the HTTP hop alone:
// its answer is the upstream's, byte for byte, headers included (no
// Content-Encoding: the transport's gzip request must not change what the
// client reads), except Date.
func TestBareProxyIsTransparent(t *testing.T) {
	e := startEnv(t, RulesSingle)
	dump := func(name string) string {
		tg, ok := e.Target(name)
		if !ok {
			t.Fatalf("no %s target", name)
		}
		c := newClient(1)
		defer c.CloseIdleConnections()
		req, err := newRequest(context.Background(), tg.URL, tg.Tokens[0])
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Header.Del("Date")
		b, err := httputil.DumpResponse(resp, true)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	direct, bare := dump(Direct), dump(BareProxy)
	if bare != direct || !strings.Contains(bare, `"text":"hello"`) {
		t.Fatalf("bare-proxy answered\n%s\ndirect answered\n%s", bare, direct)
	}
}

// The federation and stdio targets answer every call, and the report
// carries their ratios.
func TestFederationTargets(t *testing.T) {
	bin, err := BuildStdioServer(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := readyEnv(t, &Options{Federation: true, Stdio: bin, NoUsage: true, Tenants: 4})
	targets := []string{GatewayMem, FedOne, FedThree, StdioDirect, FedStdio}
	res, err := Run(context.Background(), e, RunOptions{Workers: 4, Rounds: 1, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Targets: targets})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range targets {
		if r := res.Rounds[name][0]; r.Calls == 0 || r.Errors != 0 {
			t.Errorf("%s: %+v", name, r)
		}
	}
	var b strings.Builder
	res.Print(&b)
	for _, row := range []string{"| fed-3 / fed-1 ", "| fed-1 / gateway-mem ", "| fed-stdio / stdio-direct "} {
		if !strings.Contains(b.String(), row) {
			t.Errorf("report lacks %q:\n%s", row, b.String())
		}
	}
}

// TestRoundOrder: odd rounds keep the targets' order, even rounds reverse
// it, and neither touches the caller's slice.
func TestRoundOrder(t *testing.T) {
	targets := []Target{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	names := func(ts []Target) string {
		var s string
		for _, x := range ts {
			s += x.Name
		}
		return s
	}
	for round, want := range map[int]string{1: "abc", 2: "cba", 3: "abc", 4: "cba"} {
		if got := names(roundOrder(targets, round)); got != want {
			t.Errorf("round %d: %s, want %s", round, got, want)
		}
	}
	if got := names(targets); got != "abc" {
		t.Errorf("targets changed to %s", got)
	}
}
