// Package testenv starts real servers for tests: a standalone redis-server
// (plain, with a password or an ACL user, or TLS-only) and a 6-node Redis
// Cluster (3 masters, 3 replicas).
//
// Every server listens on 127.0.0.1 on a free port, keeps nothing on disk
// (save "" and appendonly no), writes its log to a file in a temporary
// directory, and is killed when the test that started it ends. Processes are
// also started with a parent-death signal (Linux), so a crashed test binary
// does not leave servers behind.
//
// A missing binary skips the test, except when the environment variable CI is
// true: CI never skips, it fails (see RequireBinary).
//
// Every wait in this package is bounded (StartTimeout); a server that does not
// come up fails the test with the tail of its log instead of hanging.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartTimeout bounds every wait of this package: a server becoming ready, a
// killed server exiting, a cluster converging.
const StartTimeout = 10 * time.Second

// RequireBinary returns the path of the executable name found in PATH.
//
// When it is missing, the test is skipped, unless the environment variable CI
// holds a true value ("true", "1", ...): then the test fails, because CI must
// run every test against real servers and never skips.
func RequireBinary(tb testing.TB, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	Missing(tb, fmt.Sprintf("testenv: %s not found in PATH (%v); install %s", name, err, name))
	return ""
}

// InCI reports whether the environment variable CI holds a true value
// ("true", "1", ...), as .ci/run sets it.
func InCI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}

// Missing ends a test that cannot run because msg (a server, a tool, a
// package) is missing: it fails in CI, which must run every test against
// real servers and never skips, and skips elsewhere. Every such check goes
// through it, so that no test can skip in CI.
func Missing(tb testing.TB, msg string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("%s (CI is set: CI never skips)", msg)
	}
	tb.Skipf("%s; skipping (with CI=true this test fails instead: CI never skips)", msg)
}

// errPortInUse means a server could not bind its port because another
// process took it between the port being picked and the server binding it.
// The start is retried with other ports.
var errPortInUse = errors.New("port already in use")

// freePorts returns n distinct ports that were free a moment ago. All
// listeners are held open together so that the ports differ; the caller must
// still handle a bind failure, since anything can take a port once closed.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		// ":0" rather than 127.0.0.1:0: the wildcard bind only succeeds
		// when the port is free on every address.
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			return nil, fmt.Errorf("testenv: pick a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, set before done is closed

	dir string
	// Sizes of the log files when this run started: only what follows
	// belongs to this run (Restart appends to the same files).
	logOff, outOff int64
}

const (
	logName = "redis.log"  // redis-server's own log (logfile)
	outName = "stdout.log" // stdout and stderr: config errors land here
)

// startProcess runs bin with args in dir, stdout and stderr appended to
// dir/stdout.log.
func startProcess(bin, dir string, args []string) (*process, error) {
	p := &process{
		done:   make(chan struct{}),
		dir:    dir,
		logOff: fileSize(filepath.Join(dir, logName)),
		outOff: fileSize(filepath.Join(dir, outName)),
	}
	out, err := os.OpenFile(filepath.Join(dir, outName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	// The child holds its own copy of the descriptor.
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start %s: %w", bin, err)
	}
	p.cmd = cmd
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits, at most StartTimeout, for the exit.
func (p *process) kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("testenv: kill redis-server pid %d: %w", p.pid(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(StartTimeout):
		return fmt.Errorf("testenv: redis-server pid %d still running %v after SIGKILL", p.pid(), StartTimeout)
	}
}

// thisRun returns what this run wrote to its log files.
func (p *process) thisRun() string {
	return readFrom(filepath.Join(p.dir, logName), p.logOff) + readFrom(filepath.Join(p.dir, outName), p.outOff)
}

// bindFailed reports whether this run exited because its port was taken.
func (p *process) bindFailed() bool {
	return strings.Contains(p.thisRun(), "Address already in use")
}

// logTail returns the last lines of both log files, for error messages.
func (p *process) logTail() string {
	var b strings.Builder
	for _, name := range []string{logName, outName} {
		path := filepath.Join(p.dir, name)
		fmt.Fprintf(&b, "\n--- tail of %s ---\n%s", path, tail(readFrom(path, 0), 25))
	}
	return b.String()
}

// waitReady polls the server until it answers PING and reports this
// process's pid (so a server of another test that owns the port is never
// mistaken for ours), until the process exits or StartTimeout passes.
func (p *process) waitReady(addr string, tlsCfg *tls.Config, auth []string) error {
	deadline := time.Now().Add(StartTimeout)
	var last error
	for {
		if p.exited() {
			if p.bindFailed() {
				return fmt.Errorf("testenv: redis-server on %s: %w%s", addr, errPortInUse, p.logTail())
			}
			return fmt.Errorf("testenv: redis-server on %s exited before becoming ready (%v)%s", addr, p.err, p.logTail())
		}
		pid, err := probe(addr, tlsCfg, auth)
		switch {
		case err == nil && pid == p.pid():
			return nil
		case err == nil:
			last = fmt.Errorf("port answered by pid %d, not by our pid %d", pid, p.pid())
		default:
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: redis-server on %s not ready after %v (last probe: %v)%s", addr, StartTimeout, last, p.logTail())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// probe connects, authenticates with auth (AUTH arguments, none when
// empty), sends PING and returns the server's process_id from INFO server.
func probe(addr string, tlsCfg *tls.Config, auth []string) (int, error) {
	c, err := dialRESP(addr, tlsCfg, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if len(auth) > 0 {
		if _, err := c.do(append([]string{"AUTH"}, auth...)...); err != nil {
			return 0, err
		}
	}
	if v, err := c.do("PING"); err != nil {
		return 0, err
	} else if v != "PONG" {
		return 0, fmt.Errorf("PING answered %q", v)
	}
	info, err := c.doString("INFO", "server")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(infoField(info, "process_id"))
}

// respConn is the smallest RESP2 client that readiness checks need, so that
// they do not depend on the client library under test.
type respConn struct {
	net.Conn
	r *bufio.Reader
}

// respError is an error reply (-ERR ...) from the server.
type respError string

func (e respError) Error() string { return string(e) }

func dialRESP(addr string, tlsCfg *tls.Config, timeout time.Duration) (*respConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var (
		c   net.Conn
		err error
	)
	if tlsCfg != nil {
		c, err = (&tls.Dialer{Config: tlsCfg}).DialContext(ctx, "tcp", addr)
	} else {
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		c.Close()
		return nil, err
	}
	return &respConn{Conn: c, r: bufio.NewReader(c)}, nil
}

// do sends one command and returns the reply: string (simple or bulk), nil
// (null), int64, []any, or a respError as the error.
func (c *respConn) do(args ...string) (any, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return nil, err
	}
	return c.read()
}

func (c *respConn) doString(args ...string) (string, error) {
	v, err := c.do(args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: unexpected reply %T", args[0], v)
	}
	return s, nil
}

func (c *respConn) read() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, respError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		arr := make([]any, n)
		for i := range arr {
			if arr[i], err = c.read(); err != nil {
				var re respError
				if !errors.As(err, &re) {
					return nil, err
				}
				arr[i] = re
			}
		}
		return arr, nil
	}
	return nil, fmt.Errorf("unexpected RESP line %q", line)
}

// infoField returns the value of "name:value" in an INFO or CLUSTER INFO
// reply, "" when absent.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func readFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

// confQuote quotes s for a redis.conf line: redis splits config lines with
// sdssplitargs, which understands "..." with \" \\ and \xHH escapes.
func confQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "\\x%02x", c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
