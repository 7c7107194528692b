package federate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stderrTail is how many of a process's last stderr lines an error at
// start quotes.
const stderrTail = 10

// process is one run of a stdio upstream's command.
type process struct {
	cmd      *exec.Cmd
	mu       sync.Mutex
	tail     []string      // last stderr lines
	done     chan struct{} // closed when stderr ends
	waitOnce sync.Once
	waited   chan struct{} // closed when the process has exited (and was waited for)
}

// exited returns a channel closed once the process has exited; the first
// call starts the one cmd.Wait.
func (p *process) exited() <-chan struct{} {
	p.waitOnce.Do(func() {
		p.waited = make(chan struct{})
		go func() {
			// Wait closes the stderr pipe: let its last lines be read first
			// (bounded: a child of the server may hold it open).
			select {
			case <-p.done:
			case <-time.After(time.Second):
			}
			_ = p.cmd.Wait()
			close(p.waited)
		}()
	})
	return p.waited
}

func (p *process) tailText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// startProcess starts the command and initializes its session. Closing
// the session closes the process's stdin, waits up to 5s for it to exit,
// then sends SIGTERM, then SIGKILL (see stdioPipe.Close).
func (up *upstream) startProcess(ctx context.Context) (*mcp.ClientSession, error) {
	argv := up.cfg.Command
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = processEnv(up.cfg.Env)
	ownGroup(cmd) // signals reach what it started too (sh -c, npx wrappers)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go up.logStderr(p, stderr)
	w := new(wireCount)
	t := &mcp.IOTransport{
		Reader: io.NopCloser(&counted{r: stdout, w: w}), // the connection closes by closing stdin
		Writer: &stdioPipe{cmd: cmd, stdin: stdin, exited: p.exited},
	}
	cs, err := up.f.newClient(up, nil, w).Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: upstreamProtocol})
	if err != nil {
		_ = signalGroup(cmd.Process, os.Kill)
		select { // let the last stderr lines arrive
		case <-p.done:
		case <-time.After(time.Second):
		}
		if t := p.tailText(); t != "" {
			return nil, fmt.Errorf("%v; stderr:\n%s", err, t)
		}
		return nil, err
	}
	up.f.track(cs, w)
	return cs, nil
}

// baseEnv are the variables of mcpgate's own environment a stdio server
// gets (besides Upstream.Env): what programs need to run, none of
// mcpgate's secrets (its JWT secret, its store and upstream credentials).
var baseEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TEMP", "TMP", "SYSTEMROOT"}

// processEnv is the environment of a stdio server: baseEnv from mcpgate's,
// then env.
func processEnv(env map[string]string) []string {
	out := make([]string, 0, len(baseEnv)+len(env))
	for _, k := range baseEnv {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// stdioPipe is the writing end of a stdio server's session: closing it
// ends the process as MCP asks (stdin closed, then SIGTERM, then SIGKILL).
type stdioPipe struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited func() <-chan struct{}
}

func (s *stdioPipe) Write(p []byte) (int, error) { return s.stdin.Write(p) }

func (s *stdioPipe) Close() error {
	_ = s.stdin.Close()
	for _, sig := range []os.Signal{nil, syscall.SIGTERM, os.Kill} {
		if sig != nil {
			_ = signalGroup(s.cmd.Process, sig)
		}
		select {
		case <-s.exited():
			return nil
		case <-time.After(stopWait):
		}
	}
	return errors.New("federate: the stdio server does not exit")
}

// stopWait is how long Close waits after closing stdin, then after SIGTERM.
const stopWait = 5 * time.Second

// logStderr logs the process's stderr line by line and keeps the last
// lines for errors.
func (up *upstream) logStderr(p *process, r io.ReadCloser) {
	defer close(p.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		up.f.log.Info("upstream stderr", "upstream", up.cfg.Name, "line", line)
		p.mu.Lock()
		p.tail = append(p.tail, line)
		if len(p.tail) > stderrTail {
			p.tail = p.tail[1:]
		}
		p.mu.Unlock()
	}
}

// supervise restarts the process whenever it exits, with backoff (100ms
// doubling to DefaultMaxRestartGap; back to 100ms after a minute of
// running), until ctx ends. While it is down its tools fail at once.
func (up *upstream) supervise(ctx context.Context) {
	const first = 100 * time.Millisecond
	gap := first
	for {
		up.mu.Lock()
		cs := up.shared
		up.mu.Unlock()
		began := time.Now()
		if cs != nil {
			_ = cs.Wait()
		}
		if ctx.Err() != nil {
			return
		}
		up.mu.Lock()
		if up.shared == cs {
			up.shared, up.down = nil, true
			up.setStateLocked()
		}
		up.mu.Unlock()
		if time.Since(began) > time.Minute {
			gap = first
		}
		up.f.log.Warn("upstream process exited; restarting", "upstream", up.cfg.Name, "in", gap)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
			gap = min(2*gap, DefaultMaxRestartGap)
			sctx, cancel := context.WithTimeout(ctx, up.f.opts.StartTimeout)
			err := up.connectShared(sctx)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			up.f.log.Error("upstream process did not start", "upstream", up.cfg.Name, "err", err, "retry_in", gap)
		}
		up.mu.Lock()
		up.restarts++
		up.failures, up.probing = 0, false
		up.setStateLocked()
		up.mu.Unlock()
		up.f.log.Info("upstream process restarted", "upstream", up.cfg.Name)
		up.f.refresh(up)
	}
}
