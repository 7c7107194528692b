package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// DynaliteDir is the npm project, relative to this package's directory, that
// holds the dynalite DynamoDB emulator. Install it with
//
//	npm ci --prefix internal/testenv/testdata/dynalite
//
// (.ci/run does). It lives under testdata so that the go tool never walks
// its node_modules.
const DynaliteDir = "testdata/dynalite"

// Dynalite is a running dynalite, a DynamoDB emulator (an implementation of
// the DynamoDB API on LevelDB), started by StartDynaliteServer. Its data is
// kept in a LevelDB directory, so it survives Kill and Restart as a real
// table survives an outage. Its methods are safe for concurrent use.
type Dynalite struct {
	// Endpoint is the http://127.0.0.1:PORT URL for the AWS SDK
	// (AWS_ENDPOINT_URL_DYNAMODB).
	Endpoint string
	// Dir is the server's temporary directory: the LevelDB data (db/) and
	// its output (stdout.log).
	Dir string

	cli  string // dynalite's cli.js
	node string
	port int

	mu   sync.Mutex
	proc *process // nil while killed
}

// StartDynalite starts a dynalite on a free port of 127.0.0.1 and returns its
// endpoint; see StartDynaliteServer.
func StartDynalite(tb testing.TB) (endpoint string) {
	tb.Helper()
	return StartDynaliteServer(tb).Endpoint
}

// StartDynaliteServer starts a dynalite on a free port of 127.0.0.1, waits
// until it answers, and kills it when the test ends. Tables become ACTIVE
// 50ms after CreateTable (so a wait for ACTIVE is exercised, briefly).
//
// It needs node in PATH and dynalite installed in DynaliteDir. When either is
// missing the test is skipped, or fails when the environment variable CI is
// true (see RequireBinary). A server that does not start within StartTimeout
// fails the test with the tail of its output.
func StartDynaliteServer(tb testing.TB) *Dynalite {
	tb.Helper()
	node := RequireBinary(tb, "node")
	d := &Dynalite{Dir: tb.TempDir(), cli: requireDynalite(tb, dynaliteDir()), node: node}
	tb.Cleanup(d.stop)
	var last error
	for range startAttempts {
		ports, err := freePorts(1)
		if err != nil {
			tb.Fatal(err)
		}
		d.port = ports[0]
		d.Endpoint = "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(d.port))
		if last = d.start(); last == nil {
			return d
		}
		if !errors.Is(last, errPortInUse) {
			tb.Fatal(last)
		}
	}
	tb.Fatalf("testenv: dynalite did not start after %d attempts: %v", startAttempts, last)
	return nil
}

// dynaliteDir returns DynaliteDir as an absolute path.
func dynaliteDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return DynaliteDir // relative to the package directory, where go test runs
	}
	return filepath.Join(filepath.Dir(file), DynaliteDir)
}

// requireDynalite returns the path of dynalite's cli.js installed in the npm
// project dir. When it is missing the test is skipped, or fails when CI is
// true, as RequireBinary does.
func requireDynalite(tb testing.TB, dir string) string {
	tb.Helper()
	// node_modules/.bin/dynalite is a symlink to dynalite/cli.js; resolving
	// it also proves the package is there.
	cli, err := filepath.EvalSymlinks(filepath.Join(dir, "node_modules", ".bin", "dynalite"))
	if err == nil {
		return cli
	}
	msg := fmt.Sprintf("testenv: dynalite is not installed in %s (run: npm ci --prefix %s): %v", dir, dir, err)
	Missing(tb, msg)
	return ""
}

func (d *Dynalite) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.startLocked()
}

func (d *Dynalite) startLocked() error {
	p, err := startProcess(d.node, d.Dir, []string{
		// dynalite throws when a client hangs up on a request in flight,
		// which kills the server: the preload ignores that one error
		"--require", filepath.Join(dynaliteDir(), "ignore-aborted.js"),
		d.cli,
		"--host", "127.0.0.1",
		"--port", strconv.Itoa(d.port),
		"--path", filepath.Join(d.Dir, "db"),
		"--createTableMs", "50", "--deleteTableMs", "50", "--updateTableMs", "50",
	})
	if err != nil {
		return err
	}
	if err := d.waitReady(p); err != nil {
		_ = p.kill()
		return err
	}
	d.proc = p
	return nil
}

// waitReady polls until this run has said it listens and the port answers
// dynalite's health check, until the process exits or StartTimeout passes.
func (d *Dynalite) waitReady(p *process) error {
	deadline := time.Now().Add(StartTimeout)
	client := &http.Client{Timeout: time.Second}
	var last error
	for {
		out := p.thisRun()
		if p.exited() {
			if strings.Contains(out, "EADDRINUSE") {
				return fmt.Errorf("testenv: dynalite on %s: %w%s", d.Endpoint, errPortInUse, p.logTail())
			}
			return fmt.Errorf("testenv: dynalite on %s exited before becoming ready (%v)%s", d.Endpoint, p.err, p.logTail())
		}
		// The banner proves that our process bound the port, so the
		// answer below is not another server's that took it first.
		if strings.Contains(out, "Dynalite listening at") {
			last = healthy(client, d.Endpoint)
			if last == nil {
				return nil
			}
		} else {
			last = errors.New("no listening banner yet")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: dynalite on %s not ready after %v (last: %v)%s", d.Endpoint, StartTimeout, last, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// healthy sends dynalite's health check: GET / answers 200 "healthy: ...".
func healthy(client *http.Client, endpoint string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "healthy") {
		return fmt.Errorf("health check answered %s %q", resp.Status, body)
	}
	return nil
}

// Kill stops the server with SIGKILL, as a crash or an outage would; its data
// stays for Restart. Killing a killed server does nothing.
func (d *Dynalite) Kill(tb testing.TB) {
	tb.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return
	}
	err := d.proc.kill()
	d.proc = nil
	if err != nil {
		tb.Fatal(err)
	}
}

// Restart starts a killed server again on the same port and data, and waits
// until it answers. A running server is killed first.
func (d *Dynalite) Restart(tb testing.TB) {
	tb.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil {
		_ = d.proc.kill()
		d.proc = nil
	}
	if err := d.startLocked(); err != nil {
		tb.Fatalf("testenv: restart dynalite: %v", err)
	}
}

// Running reports whether the server process is alive.
func (d *Dynalite) Running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc != nil && !d.proc.exited()
}

func (d *Dynalite) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil {
		if err := d.proc.kill(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		d.proc = nil
	}
}
