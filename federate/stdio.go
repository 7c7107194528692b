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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/clip"
	gwmcp "github.com/mcpgate/mcpgate/mcp"
)

// stderrTail is how many of a process's last stderr lines an error at
// start quotes.
const stderrTail = 10

// process is one run of a stdio upstream's command, in a process group of
// its own (ownGroup). Its pipes are the Federator's own os.Pipe ends, not
// exec's: exec's Wait closes stdout and stderr the moment the leader exits,
// dropping the lines still in them (so Wait, and with it noticing the
// exit, would have to wait for them), and exec's stdin pipe hides the
// *os.File whose write deadline bounds a write the process does not read
// (see stdioPipe).
type process struct {
	cmd    *exec.Cmd
	stdin  *os.File
	stdout *os.File
	stderr *os.File

	mu   sync.Mutex
	tail []string // last stderr lines

	outEnd  chan struct{} // closed when a read of stdout failed (EOF, or closed by watch)
	outOnce sync.Once
	errEnd  chan struct{} // closed when stderr ends
	exited  chan struct{} // closed when the leader has exited and was waited for
	stopped chan struct{} // closed when watch is done: group ended, pipes closed
}

func (p *process) tailText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// stdoutReader is the process's stdout as the session reads it: it tells
// watch when the last line was read.
type stdoutReader struct{ p *process }

func (r stdoutReader) Read(b []byte) (int, error) {
	n, err := r.p.stdout.Read(b)
	if err != nil {
		r.p.outOnce.Do(func() { close(r.p.outEnd) })
	}
	return n, err
}

// Bounds of the end of a process (see watch and stop).
const (
	// stopWait is how long stop waits after closing stdin, then after
	// SIGTERM.
	stopWait = 5 * time.Second
	// groupGrace is how long the processes left in a group after its
	// leader exited have between SIGTERM and SIGKILL.
	groupGrace = 2 * time.Second
	// pipeDrain is how long the session may go on reading stdout (its last
	// answers) and stderr after the leader exited; a helper left in the
	// group holds them open until it is gone.
	pipeDrain = time.Second
	// writeChunk is how much of a message one write to stdin carries, so
	// that a write that makes progress is told from one that does not.
	writeChunk = 16 << 10
)

// startProcess starts the command and initializes its session. The process
// is stopped as MCP asks when the session is closed (stdin closed, then
// SIGTERM, then SIGKILL: see stdioPipe.Close), and whatever it left in its
// process group is stopped when it exits (see watch).
func (up *upstream) startProcess(ctx context.Context) (*mcp.ClientSession, *stdioPipe, error) {
	argv := up.cfg.Command
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = processEnv(up.cfg.Env)
	ownGroup(cmd) // signals reach what it started too (sh -c, npx wrappers)
	// Pairs of read and write ends: stdin (the child's, ours), stdout
	// (ours, the child's), stderr (ours, the child's).
	var ends [6]*os.File
	for i := 0; i < len(ends); i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeFiles(ends[:i]...)
			return nil, nil, err
		}
		ends[i], ends[i+1] = r, w
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = ends[0], ends[3], ends[5]
	err := cmd.Start()
	closeFiles(ends[0], ends[3], ends[5]) // the child's now
	if err != nil {
		closeFiles(ends[1], ends[2], ends[4])
		return nil, nil, err
	}
	p := &process{cmd: cmd, stdin: ends[1], stdout: ends[2], stderr: ends[4],
		outEnd: make(chan struct{}), errEnd: make(chan struct{}), exited: make(chan struct{}), stopped: make(chan struct{})}
	up.f.procs.Add(1)
	go up.watch(p)
	go up.logStderr(p)
	w := new(wireCount)
	pipe := &stdioPipe{up: up, p: p, stall: up.writeStall()}
	t := &mcp.IOTransport{
		// the connection closes by closing stdin
		Reader: io.NopCloser(&counted{r: newJSONLines(stdoutReader{p}, gwmcp.DefaultMaxResponseBytes, up.skippedLine(), up.oversizeAnswer), w: w}),
		Writer: pipe,
		// jsonLines bounds each line; the SDK's bound, past which it ends
		// the session, counts what its decoder reads ahead too, so it is
		// set well past that, never to be the one reached.
		MaxLineLength: 2 * gwmcp.DefaultMaxResponseBytes,
	}
	cs, err := up.f.newClient(up, nil, w).Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: upstreamProtocol})
	if err != nil {
		_ = signalGroup(cmd.Process, os.Kill)
		<-p.stopped // its last stderr lines read
		if t := p.tailText(); t != "" {
			return nil, nil, fmt.Errorf("%v; stderr:\n%s", err, t)
		}
		return nil, nil, err
	}
	up.f.track(cs, w)
	return cs, pipe, nil
}

// skippedLine returns what logs the lines a process's stdout holds besides
// messages (see jsonLines): the first ten of each process, then one in a
// thousand with the count, so that a chatty server cannot flood the log.
func (up *upstream) skippedLine() func([]byte) {
	var n int64 // the session reads stdout from one goroutine
	return func(line []byte) {
		n++
		if n <= 10 || n%1000 == 0 {
			up.f.log.Warn("upstream wrote a line that is not a message to stdout: skipped (write logs to stderr)",
				"upstream", up.cfg.Name, "line", clip.String(strings.TrimRight(string(line), "\r\n"), 200), "skipped", n)
		}
	}
}

// oversizeAnswer logs an answer of the process's dropped for its size
// (see jsonLines): its call fails, the session goes on.
func (up *upstream) oversizeAnswer(head []byte, id jsonrpc.ID) {
	up.f.log.Warn("upstream answer over the answer bound: dropped, its call failed",
		"upstream", up.cfg.Name, "id", id.Raw(), "bound", gwmcp.DefaultMaxResponseBytes, "start", clip.String(string(head), 200))
}

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			_ = f.Close()
		}
	}
}

// watch waits for the process's leader to exit, then ends what it leaves
// behind: the other processes of its group (a helper it started, the
// server an "sh -c" wrapper ran) get SIGTERM, then SIGKILL after
// groupGrace; stdout is closed once read to its end or after pipeDrain (a
// helper may hold it open), which ends the session and fails its calls at
// once; stdin and stderr are closed. The group is signalled only while it
// has a member, as the group id cannot be reused while one lives: right
// after the leader was waited for (none left: ESRCH, and nothing more is
// sent), then until a check finds it empty.
func (up *upstream) watch(p *process) {
	defer up.f.procs.Done()
	defer close(p.stopped)
	_ = p.cmd.Wait()
	close(p.exited)
	// A write the process never reads would wait for its write deadline.
	_ = p.stdin.Close()
	left := signalGroup(p.cmd.Process, syscall.SIGTERM) == nil
	drain(p.outEnd, pipeDrain)
	_ = p.stdout.Close()
	if left {
		deadline := time.Now().Add(groupGrace)
		for groupAlive(p.cmd.Process) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if groupAlive(p.cmd.Process) {
			_ = signalGroup(p.cmd.Process, os.Kill)
		}
	}
	drain(p.errEnd, pipeDrain)
	_ = p.stderr.Close()
}

// drain waits until ch is closed, for at most d, and reports whether it
// was.
func drain(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// writeStall is how long a write to the process's stdin may make no
// progress before the process counts as wedged: the longest idle timeout a
// call to it may have (its Timeout, or a longer ToolTimeouts entry for a
// name with its Prefix). A server that reads nothing for that long while a
// request waits is as silent as a call that times out, and the write would
// otherwise hold the session's write lock, and with it every other call
// and Close, forever.
func (up *upstream) writeStall() time.Duration {
	d := up.cfg.Timeout
	for name, t := range up.f.opts.ToolTimeouts {
		if strings.HasPrefix(name, up.cfg.Prefix) && t > d {
			d = t
		}
	}
	return d
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

// errWedged is the error of a write to a stdio server that stopped
// reading its stdin.
var errWedged = errors.New("federate: the stdio server does not read its input")

// stdioPipe is the writing end of a stdio server's session. A write that
// makes no progress for stall kills the process group (it is wedged: see
// writeStall), which ends the session and lets supervise restart the
// process. Closing it ends the process as MCP asks (stdin closed, then
// SIGTERM, then SIGKILL) and waits for watch to end its group; it may be
// called by the SDK (the session closed) and by upstream.close (which
// does not wait for the session's calls) alike.
type stdioPipe struct {
	up        *upstream
	p         *process
	stall     time.Duration
	wedged    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

func (s *stdioPipe) Write(b []byte) (int, error) {
	if s.wedged.Load() {
		return 0, errWedged
	}
	n := 0
	for n < len(b) {
		_ = s.p.stdin.SetWriteDeadline(time.Now().Add(s.stall))
		m, err := s.p.stdin.Write(b[n:min(len(b), n+writeChunk)])
		n += m
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded) && m > 0:
			// It reads, slowly: a new deadline.
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.wedge()
			return n, errWedged
		default:
			return n, err
		}
	}
	return n, nil
}

// wedge kills the process group of a server that stopped reading: a
// graceful stop would wait on the same pipe.
func (s *stdioPipe) wedge() {
	if s.wedged.Swap(true) {
		return
	}
	select {
	case <-s.p.exited: // watch is ending it already
		return
	default:
	}
	s.up.f.log.Error("upstream stdio server read nothing of a pending request; killing it", "upstream", s.up.cfg.Name, "after", s.stall)
	_ = signalGroup(s.p.cmd.Process, os.Kill)
}

func (s *stdioPipe) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.p.stop() })
	return s.closeErr
}

// stop ends the process as MCP asks: stdin closed, then SIGTERM to its
// group after stopWait, then SIGKILL after stopWait more; then it waits
// for watch to have ended what the leader left behind.
func (p *process) stop() error {
	_ = p.stdin.Close()
	for _, sig := range []os.Signal{nil, syscall.SIGTERM, os.Kill} {
		if sig != nil {
			_ = signalGroup(p.cmd.Process, sig)
		}
		if drain(p.exited, stopWait) {
			<-p.stopped
			return nil
		}
	}
	return errors.New("federate: the stdio server does not exit")
}

// Bounds of the logging of a process's stderr (see logStderr).
const (
	// stderrLineMax is the most of one stderr line logged and kept for
	// errors: the rest of a longer line (a dumped request) is dropped.
	stderrLineMax = 64 << 10
	// stderrPerSecond is how many stderr lines of a process are logged
	// per second at most, so that a server logging in a loop cannot flood
	// the log (and, as logging is synchronous, slow every other upstream's
	// logging): enough for a crash's stack traces. The MCP log messages
	// of a shared session, which go to the same log, have the same bound
	// (see relayLog).
	stderrPerSecond = 1000
)

// logStderr logs the process's stderr line by line and keeps the last
// lines for errors. It reads stderr to its end whatever it holds: a
// reader that stopped (at a line too long, say) would leave the pipe
// full, and the server blocked writing its logs would answer nothing.
func (up *upstream) logStderr(p *process) {
	defer close(p.errEnd)
	br := bufio.NewReaderSize(p.stderr, stderrLineMax)
	var budget lineBudget
	inLine := false // the last chunk did not end its line: the rest is dropped
	for {
		chunk, err := br.ReadSlice('\n')
		full := errors.Is(err, bufio.ErrBufferFull)
		if len(chunk) > 0 && !inLine {
			line := strings.TrimSuffix(strings.TrimSuffix(string(chunk), "\n"), "\r")
			if ok, dropped := budget.take(time.Now()); ok {
				attrs := []any{"upstream", up.cfg.Name, "line", line}
				if full {
					attrs = append(attrs, "cut_at", stderrLineMax)
				}
				if dropped > 0 {
					attrs = append(attrs, "dropped_before", dropped)
				}
				up.f.log.Info("upstream stderr", attrs...)
			}
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > stderrTail {
				p.tail = p.tail[1:]
			}
			p.mu.Unlock()
		}
		inLine = full
		if err != nil && !full {
			if budget.dropped > 0 {
				up.f.log.Info("upstream stderr ended", "upstream", up.cfg.Name, "dropped_before", budget.dropped)
			}
			return
		}
	}
}

// lineBudget allows stderrPerSecond lines per second (a window opened by
// the first line past the last window) and counts the lines it refused
// since the last one it allowed. It is safe for concurrent use: the log
// messages of an upstream session may be handled on several goroutines.
type lineBudget struct {
	mu      sync.Mutex
	window  time.Time
	n       int // lines allowed in the window
	dropped int
}

// take reports whether a line at now may be logged and, if so, how many
// were refused before it.
func (b *lineBudget) take(now time.Time) (ok bool, dropped int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.window) >= time.Second {
		b.window, b.n = now, 0
	}
	if b.n >= stderrPerSecond {
		b.dropped++
		return false, 0
	}
	b.n++
	dropped, b.dropped = b.dropped, 0
	return true, dropped
}

// supervise restarts the process whenever it exits (or its session ends),
// with backoff (100ms doubling to DefaultMaxRestartGap; back to 100ms after
// a minute of running), until ctx ends. While it is down its tools fail at
// once.
func (up *upstream) supervise(ctx context.Context) {
	gap := restartFirstGap
	for {
		up.mu.Lock()
		cs, pipe := up.shared, up.pipe
		up.mu.Unlock()
		began := time.Now()
		if cs != nil && !up.waitEnd(ctx, cs, pipe) {
			return
		}
		if ctx.Err() != nil {
			return
		}
		up.mu.Lock()
		if up.shared == cs {
			up.shared, up.pipe, up.down = nil, nil, true
			up.setStateLocked()
		}
		up.mu.Unlock()
		if cs != nil && !up.f.spawn(func() { up.endSession(cs, pipe) }) {
			up.endSession(cs, pipe) // Close runs: it no longer sees cs
		}
		gap = restartGap(gap, began)
		up.f.log.Warn("upstream process exited; restarting", "upstream", up.cfg.Name, "in", gap)
		if !up.restart(ctx, &gap, up.connectShared, func(err error) {
			up.f.log.Error("upstream process did not start", "upstream", up.cfg.Name, "err", err, "retry_in", gap)
		}) {
			return
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

// waitEnd waits until the process of session cs exits or cs ends, and
// reports true; false when ctx ended first. The leader's exit is watched
// as well as the session: a helper it left holding stdout would keep the
// session open, and its calls waiting, after the server is gone.
func (up *upstream) waitEnd(ctx context.Context, cs *mcp.ClientSession, pipe *stdioPipe) bool {
	ended := make(chan struct{})
	if !up.f.spawn(func() { _ = cs.Wait(); close(ended) }) {
		return false
	}
	select {
	case <-ended:
	case <-pipe.p.exited:
	case <-ctx.Done():
		return false
	}
	return true
}

// endSession closes a stdio session and stops its process. cs.Close waits
// for the calls in flight, and one whose request the process does not
// read would hold it forever: the process is stopped alongside (which
// ends those calls), and cs.Close is waited for at most stopWait after.
func (up *upstream) endSession(cs *mcp.ClientSession, pipe *stdioPipe) {
	closed := make(chan struct{})
	go func() {
		_ = cs.Close()
		close(closed)
	}()
	if err := pipe.Close(); err != nil {
		up.f.log.Error("upstream process did not stop", "upstream", up.cfg.Name, "err", err)
	}
	if !drain(closed, stopWait) {
		up.f.log.Warn("upstream session did not close after its process stopped", "upstream", up.cfg.Name)
	}
}
