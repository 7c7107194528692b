package conformance

// The Node side: finding the installed suite, starting its reference server,
// running the server scenarios and reading their results.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// nodeDir is the npm project holding the suite, relative to this package.
const nodeDir = "testdata/node"

// installHint is the command that installs what this test needs.
const installHint = "scripts/test installs it; by hand: npm ci --prefix internal/conformance/testdata/node --ignore-scripts && npm rebuild --prefix internal/conformance/testdata/node node"

// tokenEnv names the variable bearer.mjs reads the gateway token from.
const tokenEnv = "MCPGATE_CONFORMANCE_TOKEN"

// suiteTimeout bounds one run of all scenarios; a run takes seconds.
const suiteTimeout = 3 * time.Minute

// suite is an installed conformance suite.
type suite struct {
	node        string // the Node 22 binary
	dir         string // the npm project (absolute)
	conformance string // the suite's CLI script
	bearer      string // the preload adding the bearer token
	server      string // the reference server (everything-server.ts)
}

// requireSuite returns the installed suite. When any part is missing the
// test is skipped with the command that installs it, or fails when CI is
// true: CI never skips.
func requireSuite(t *testing.T) *suite {
	t.Helper()
	s, err := findSuite()
	if err == nil {
		return s
	}
	msg := fmt.Sprintf("conformance: the MCP conformance suite is not installed (%v); %s", err, installHint)
	testenv.Missing(t, msg)
	return nil
}

func findSuite() (*suite, error) {
	dir, err := filepath.Abs(nodeDir)
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "node_modules", ".bin")
	s := &suite{
		dir:    dir,
		bearer: filepath.Join(dir, "bearer.mjs"),
		server: filepath.Join(dir, "everything-server.ts"),
	}
	if s.node, err = filepath.EvalSymlinks(filepath.Join(bin, "node")); err != nil {
		return nil, fmt.Errorf("no Node 22 from the node package: %w", err)
	}
	if s.conformance, err = filepath.EvalSymlinks(filepath.Join(bin, "conformance")); err != nil {
		return nil, fmt.Errorf("no @modelcontextprotocol/conformance: %w", err)
	}
	if _, err := os.Stat(filepath.Join(bin, "tsx")); err != nil {
		return nil, fmt.Errorf("no tsx for the reference server: %w", err)
	}
	out, err := exec.Command(s.node, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", s.node, err)
	}
	version := strings.TrimSpace(string(out))
	major, _, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	if n, err := strconv.Atoi(major); err != nil || n < 22 {
		return nil, fmt.Errorf("%s is node %s, the suite needs 22 or later", s.node, version)
	}
	return s, nil
}

// endpointLine is what the reference server prints once it listens.
var endpointLine = regexp.MustCompile(`MCP endpoint: (http://127\.0\.0\.1:\d+/mcp)`)

// startReference starts the suite's reference server on a free port of
// 127.0.0.1 and returns its MCP endpoint and its output so far (read at the
// end for diagnostics). It is killed when the test ends.
func startReference(t *testing.T, s *suite) (url string, output *testenv.SyncBuffer) {
	t.Helper()
	// --import tsx runs the TypeScript in this process (the tsx CLI would
	// spawn a child that a kill of its parent leaves running).
	cmd := exec.Command(s.node, "--import", "tsx", s.server)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "PORT=0")
	cmd.SysProcAttr = sysProcAttr()
	output = &testenv.SyncBuffer{}
	pr, pw := io.Pipe()
	cmd.Stdout = io.MultiWriter(output, pw)
	cmd.Stderr = output
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the reference server: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		pw.Close()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := endpointLine.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr) // keep the pipe drained
	}()
	select {
	case url = <-found:
		return url, output
	case <-done:
		t.Fatalf("the reference server exited before listening:\n%s", output.String())
	case <-time.After(30 * time.Second): // tsx compiles the server first
		t.Fatalf("the reference server did not listen within 30s:\n%s", output.String())
	}
	return "", nil
}

// outcome is one scenario's result in one run.
type outcome struct {
	passed, failed int      // checks that succeeded, failed (warnings count as neither)
	failures       []string // "CheckName: error" of every failed check
	warnings       []string // "CheckName: message" of every check with a warning
}

func (o outcome) ok() bool { return o.failed == 0 }

func (o outcome) String() string {
	if o.ok() {
		return "pass"
	}
	return "FAIL"
}

// runSuite runs every server scenario of the suite (--suite all: the active
// ones and the pending ones) against url, adding the bearer token to each
// request when token is not empty, and returns each scenario's outcome.
func runSuite(t *testing.T, s *suite, url, token string) (map[string]outcome, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), suiteTimeout)
	defer cancel()
	work := t.TempDir()
	results := filepath.Join(work, "results")
	args := []string{s.conformance, "server", "--suite", "all", "--url", url, "--output-dir", results}
	env := os.Environ()
	if token != "" {
		args = append([]string{"--import", s.bearer}, args...)
		env = append(env, tokenEnv+"="+token)
	}
	cmd := exec.CommandContext(ctx, s.node, args...)
	cmd.Dir = work
	cmd.Env = env
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) || ctx.Err() != nil {
		return nil, fmt.Errorf("conformance server --url %s: %v (%v)\n%s", url, err, ctx.Err(), out)
	}
	outcomes, perr := parseSummary(string(out))
	if perr != nil {
		return nil, fmt.Errorf("conformance server --url %s (%v): %w\n%s", url, err, perr, out)
	}
	if err := addChecks(outcomes, results); err != nil {
		return nil, err
	}
	return outcomes, nil
}

// scenarioPasses runs one scenario against url without a bearer token and
// reports whether it passed (the suite exits 0 only then).
func scenarioPasses(t *testing.T, s *suite, url, scenario string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), suiteTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.node, s.conformance, "server", "--scenario", scenario, "--url", url)
	cmd.Dir = t.TempDir()
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) || ctx.Err() != nil {
		t.Fatalf("conformance server --scenario %s --url %s: %v (%v)\n%s", scenario, url, err, ctx.Err(), out)
	}
	return err == nil
}

// summaryLine is one scenario's line in the suite's closing summary.
var summaryLine = regexp.MustCompile(`^[✓✗] (\S+): (\d+) passed, (\d+) failed$`)

// parseSummary reads the outcomes from the summary the suite prints after
// "=== SUMMARY ===". It fails when there is no summary or it lists nothing.
func parseSummary(out string) (map[string]outcome, error) {
	_, summary, ok := strings.Cut(out, "=== SUMMARY ===")
	if !ok {
		return nil, errors.New("no summary in the suite's output")
	}
	outcomes := make(map[string]outcome)
	for line := range strings.Lines(summary) {
		m := summaryLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		passed, _ := strconv.Atoi(m[2])
		failed, _ := strconv.Atoi(m[3])
		outcomes[m[1]] = outcome{passed: passed, failed: failed}
	}
	if len(outcomes) == 0 {
		return nil, errors.New("the suite's summary lists no scenario")
	}
	return outcomes, nil
}

// resultDir is the name of a scenario's results directory:
// server-<scenario>-<ISO timestamp with : and . replaced by ->.
var resultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)

// addChecks adds to each outcome the failed checks and the warnings its
// checks.json records. A scenario that threw has no checks.json; its
// failure is then only what the summary says.
func addChecks(outcomes map[string]outcome, results string) error {
	entries, err := os.ReadDir(results)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		o, ok := outcomes[m[1]]
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(results, e.Name(), "checks.json"))
		if err != nil {
			continue
		}
		var checks []struct {
			Name         string `json:"name"`
			Status       string `json:"status"`
			ErrorMessage string `json:"errorMessage"`
		}
		if err := json.Unmarshal(data, &checks); err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		for _, c := range checks {
			switch c.Status {
			case "FAILURE":
				o.failures = append(o.failures, c.Name+": "+c.ErrorMessage)
			case "WARNING":
				o.warnings = append(o.warnings, c.Name+": "+c.ErrorMessage)
			}
		}
		outcomes[m[1]] = o
	}
	return nil
}

// scenarioNames returns the scenarios of all runs, sorted.
func scenarioNames(runs ...map[string]outcome) []string {
	seen := make(map[string]bool)
	for _, r := range runs {
		for name := range r {
			seen[name] = true
		}
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
