package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"

	"github.com/mcpgate/mcpgate/cli"
)

// gatewayRuns is how many times in a row the suite runs through the
// gateway: all runs must agree, so a scenario that only sometimes fails
// (an ordering race) shows up.
const gatewayRuns = 3

const secret = "conformance-secret-0123456789abcdef0123"

// The official conformance suite's server scenarios pass through mcpgate as
// they pass against the reference server directly: the same scenarios, in
// three runs in a row through one gateway. A scenario failing through the
// gateway names its failed checks.
func TestConformanceThroughGateway(t *testing.T) {
	s := requireSuite(t)
	upstream, upstreamLog := startReference(t, s)
	gateway, gatewayLog := startGateway(t, upstream)
	token := suiteToken(t)

	// The token is what lets the suite through: without it the gateway
	// refuses even the handshake.
	if scenarioPasses(t, s, gateway+"/mcp", "server-initialize") {
		t.Fatal("server-initialize passed through the gateway without a bearer token")
	}

	compareThroughGateway(t, s, upstream, gateway+"/mcp", token, gatewayRuns, "mcpgate", upstreamLog, gatewayLog)
}

// compareThroughGateway runs the suite against the reference server, then
// n times through the gateway, and fails every scenario that passes
// directly but not through the gateway (or not in every run); what names
// the gateway in the logs.
func compareThroughGateway(t *testing.T, s *suite, reference, gateway, token string, n int, what string, referenceLog, gatewayLog *testenv.SyncBuffer) {
	t.Helper()
	direct, err := runSuite(t, s, reference, "")
	if err != nil {
		t.Fatalf("direct run: %v\nreference server output:\n%s", err, referenceLog.String())
	}
	runs := make([]map[string]outcome, n)
	for i := range runs {
		if runs[i], err = runSuite(t, s, gateway, token); err != nil {
			t.Fatalf("run %d through %s: %v\ngateway log:\n%s", i+1, what, err, gatewayLog.String())
		}
	}
	t.Logf("per-scenario results (direct: against the reference server; gw N: run N through %s):\n%s", what, table(direct, runs))

	passedDirectly := 0
	for _, name := range scenarioNames(append([]map[string]outcome{direct}, runs...)...) {
		d, ok := direct[name]
		switch {
		case !ok:
			t.Errorf("%s: ran through %s but not directly", name, what)
			continue
		case !d.ok():
			t.Logf("%s fails directly, not compared: %s", name, strings.Join(d.failures, "; "))
		default:
			passedDirectly++
		}
		checkGatewayRuns(t, name, d, runs)
	}
	if passedDirectly == 0 {
		t.Fatalf("no scenario passes against the reference server: the suite or its server is broken\nreference server output:\n%s", referenceLog.String())
	}
	if t.Failed() {
		t.Logf("gateway log:\n%s", gatewayLog.String())
	}
}

// checkGatewayRuns reports a scenario that passes directly but fails in a
// gateway run, and one whose gateway runs disagree.
func checkGatewayRuns(t *testing.T, name string, direct outcome, runs []map[string]outcome) {
	t.Helper()
	var results []string
	for i, r := range runs {
		o, ok := r[name]
		switch {
		case !ok:
			t.Errorf("%s: ran directly but not in gateway run %d", name, i+1)
			results = append(results, "missing")
			continue
		case direct.ok() && !o.ok():
			t.Errorf("%s passes directly but fails through the gateway in run %d: %s", name, i+1, strings.Join(o.failures, "; "))
		}
		results = append(results, o.String())
		if len(o.warnings) != len(direct.warnings) {
			t.Logf("note: %s has %d warnings directly, %d in gateway run %d: %s", name, len(direct.warnings), len(o.warnings), i+1, strings.Join(o.warnings, "; "))
		}
	}
	for _, r := range results[1:] {
		if r != results[0] {
			t.Errorf("%s: the %d runs through the gateway disagree: %s", name, len(runs), strings.Join(results, ", "))
			break
		}
	}
}

// table formats the outcome of every scenario in every run.
func table(direct map[string]outcome, runs []map[string]outcome) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprint(w, "scenario\tdirect")
	for i := range runs {
		fmt.Fprintf(w, "\tgw %d", i+1)
	}
	fmt.Fprintln(w, "\tfailed checks through the gateway")
	for _, name := range scenarioNames(append([]map[string]outcome{direct}, runs...)...) {
		fmt.Fprintf(w, "%s\t%s", name, cell(direct, name))
		var why []string
		for _, r := range runs {
			fmt.Fprintf(w, "\t%s", cell(r, name))
			if o, ok := r[name]; ok && !o.ok() && len(why) == 0 {
				why = o.failures
			}
		}
		fmt.Fprintf(w, "\t%s\n", strings.Join(why, "; "))
	}
	_ = w.Flush()
	return b.String()
}

func cell(run map[string]outcome, name string) string {
	o, ok := run[name]
	if !ok {
		return "-"
	}
	c := fmt.Sprintf("%s %d/%d", o, o.passed, o.passed+o.failed)
	if len(o.warnings) > 0 {
		c += fmt.Sprintf(" w%d", len(o.warnings))
	}
	return c
}

// listening is the log line of `mcpgate serve` once it accepts connections.
var listening = regexp.MustCompile(`msg="mcpgate listening" addr=(\S+)`)

// startGateway runs `mcpgate serve` in this process (cli.Main), in front of
// upstream, with the in-process store and HS256 tokens signed with secret,
// and returns its base URL and its log. It stops when the test ends.
//
// Its upstream timeout is 5s, not the default 60s: every scenario takes
// milliseconds, and a call whose server-initiated request was lost (the
// upstream never answers it) then fails in 5s instead of holding the run
// until the suite's own 60s request timeout.
func startGateway(t *testing.T, upstream string) (url string, log *testenv.SyncBuffer) {
	t.Helper()
	return startGatewayWith(t, fmt.Sprintf("upstream: {url: %q, timeout: 5s}\n", upstream))
}

// startGatewayWith is startGateway with upstreamYAML (the upstream section,
// or upstream and upstreams: YAML lines) in its config.
func startGatewayWith(t *testing.T, upstreamYAML string) (url string, log *testenv.SyncBuffer) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "mcpgate.yaml")
	config := fmt.Sprintf(`listen: 127.0.0.1:0
%sauth:
  jwt: {hs256_secret_env: MCPGATE_CONFORMANCE_SECRET}
usage: {store: %q, flush_interval: 1s}
default_tier: free
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 1000000, period: 1m}
      # the suite opens a session per scenario, all as one tenant and subject
      - {name: all_methods, per: tenant, methods: ["*"], algorithm: fixed_window, limit: 1000000, period: 1m}
sessions: {max_per_tenant: 10000, max_per_subject: 10000}
`, upstreamYAML, "sqlite:"+filepath.Join(dir, "usage.db"))
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MCPGATE_CONFORMANCE_SECRET", secret)
	if code := cli.Main(t.Context(), []string{"usage", "init", "--config", cfg}, &testenv.SyncBuffer{}, &testenv.SyncBuffer{}); code != 0 {
		t.Fatalf("mcpgate usage init: exit %d", code)
	}

	ctx, cancel := context.WithCancel(context.Background())
	log = &testenv.SyncBuffer{}
	done := make(chan int, 1)
	go func() { done <- cli.Main(ctx, []string{"serve", "--config", cfg}, &testenv.SyncBuffer{}, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("mcpgate did not stop after its context ended")
		}
	})
	deadline := time.After(20 * time.Second)
	for {
		if m := listening.FindStringSubmatch(log.String()); m != nil {
			return "http://" + m[1], log
		}
		select {
		case code := <-done:
			t.Fatalf("mcpgate serve exited with %d:\n%s", code, log.String())
		case <-deadline:
			t.Fatalf("mcpgate serve did not listen within 20s:\n%s", log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
