package federate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stderrTail is how many of a process's last stderr lines an error at
// start quotes.
const stderrTail = 10

// process is one run of a stdio upstream's command.
type process struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	tail []string // last stderr lines
	done chan struct{}
}

func (p *process) tailText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// startProcess starts the command and initializes its session. The SDK's
// command transport owns the process: closing the session closes its
// stdin, waits 5s, then sends SIGTERM (and SIGKILL).
func (up *upstream) startProcess(ctx context.Context) (*mcp.ClientSession, error) {
	argv := up.cfg.Command
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = os.Environ()
	for k, v := range up.cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	cs, err := up.f.newClient(up, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: upstreamProtocol})
	if cmd.Process != nil {
		go up.logStderr(p, stderr)
	} else {
		_ = stderr.Close()
		close(p.done)
	}
	if err != nil {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			select { // let the last stderr lines arrive
			case <-p.done:
			case <-time.After(time.Second):
			}
		}
		if t := p.tailText(); t != "" {
			return nil, fmt.Errorf("%v; stderr:\n%s", err, t)
		}
		return nil, err
	}
	up.mu.Lock()
	up.proc = p
	up.mu.Unlock()
	return cs, nil
}

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
