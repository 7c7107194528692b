// Package audit writes mcpgate's audit log: one JSON object per line for
// each governed call, appended to a file (or written to standard output).
//
// Writes never block the caller: Log puts the record in a bounded buffer
// and one writer goroutine encodes and writes it; when the buffer is full
// the record is dropped and counted (Options.OnDrop, Dropped). Rotation is
// left to the platform (logrotate, a container runtime): after the file was
// renamed, Reopen makes new lines go to a new file at the same path. Close
// writes what is buffered and closes the file; behind a stalled write it
// gives up after a few seconds, dropping what is still queued (ErrStalled).
package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/clip"
)

// Stdout is the path that writes the log to standard output.
const Stdout = "-"

// DefaultBuffer is the number of records Log may queue ahead of the writer.
const DefaultBuffer = 4096

// ErrClosed means the Logger was closed: Flush and Reopen have nothing to
// write to.
var ErrClosed = errors.New("audit: logger closed")

// ErrStalled means Close gave up waiting for the writer, stuck on a write
// (a stalled disk): the records still queued were dropped.
var ErrStalled = errors.New("audit: writer stalled on a write")

// closeWait bounds how long Close waits for the writer.
var closeWait = 5 * time.Second

// Record is one line of the audit log. Strings are written as JSON strings:
// a tenant or tool name holding newlines, quotes or invalid UTF-8 (replaced
// by U+FFFD) still makes exactly one valid line.
type Record struct {
	// Time is when the call arrived (written in UTC, RFC 3339 with
	// nanoseconds).
	Time time.Time `json:"time"`
	// RequestID is the X-Request-Id the gateway answered with.
	RequestID string `json:"request_id"`
	Tenant    string `json:"tenant"`
	Subject   string `json:"subject"`
	// Method is the JSON-RPC method (tools/call, initialize, ...).
	Method string `json:"method"`
	// Tool, Prompt and Resource name the target of tools/call, prompts/get
	// and resources/read; at most one is set.
	Tool     string `json:"tool,omitempty"`
	Prompt   string `json:"prompt,omitempty"`
	Resource string `json:"resource,omitempty"`
	// Decision is the gateway's: admitted, cached, denied, forbidden or
	// unavailable.
	Decision string `json:"decision"`
	// Scope and Rule name what decided: for a denial the denying rule and
	// its per (or quota / breaker), for a forbidden call "scope"; for an
	// admitted call the most restrictive rule that admitted it.
	Scope string `json:"scope,omitempty"`
	Rule  string `json:"rule,omitempty"`
	// Degraded is the failure policy applied when the limit store failed.
	Degraded string `json:"degraded,omitempty"`
	// Cost is what the call was charged, in the tool's cost units (after a
	// correction from the result); 0 for a refused call and for methods
	// other than tools/call.
	Cost int64 `json:"cost"`
	// LatencyMS is how long the gateway took over the call, in milliseconds.
	LatencyMS float64 `json:"latency_ms"`
	// Status is the HTTP status sent to the caller (0: none, the caller
	// went away first).
	Status int `json:"status"`
	// Upstream is how the upstream call ended, for calls that made one: ok,
	// tool_error, rpc_error, http_<status>, transport_error or cancelled.
	Upstream string `json:"upstream,omitempty"`
	// Cache is where a cacheable tool's answer came from (hit, miss,
	// stale, coalesced).
	Cache string `json:"cache,omitempty"`
	// Arguments are the tools/call arguments, only when the gateway is
	// configured to include them, and at most MaxArguments bytes of them:
	// larger ones are left out and ArgumentsOmitted says how large they were.
	Arguments        json.RawMessage `json:"arguments,omitempty"`
	ArgumentsOmitted int             `json:"arguments_omitted_bytes,omitempty"`
}

// Bounds of a record. Names and arguments come from the client, up to the
// gateway's body limit (4 MiB by default), and a refused call costs the
// client nothing: without bounds a client could fill the disk with a few
// requests, and the queue (DefaultBuffer records) could hold gigabytes
// behind a slow disk.
const (
	// MaxField is the most bytes a string field keeps; a longer one is cut
	// on a UTF-8 boundary and ends with "…".
	MaxField = 512
	// MaxArguments is the most bytes of arguments a record keeps.
	MaxArguments = 16 << 10
)

// bound cuts rec's strings to MaxField and leaves out arguments longer
// than MaxArguments. The arguments kept are copied: the caller's may point
// into a request body, which the queue would otherwise keep alive.
func bound(rec *Record) {
	for _, f := range []*string{&rec.RequestID, &rec.Tenant, &rec.Subject, &rec.Method, &rec.Tool,
		&rec.Prompt, &rec.Resource, &rec.Scope, &rec.Rule, &rec.Cache, &rec.Upstream} {
		*f = clip.String(*f, MaxField)
	}
	switch n := len(rec.Arguments); {
	case n > MaxArguments:
		rec.Arguments, rec.ArgumentsOmitted = nil, n
	case n > 0:
		rec.Arguments = bytes.Clone(rec.Arguments)
	}
}

// Options tune a Logger. The zero value is the defaults.
type Options struct {
	// Buffer is the number of records queued ahead of the writer; a record
	// that finds it full is dropped. Zero: DefaultBuffer.
	Buffer int
	// OnDrop is called (from Log's or the writer's goroutine) for each
	// record lost: dropped on a full buffer or failed to write. Nil: none.
	OnDrop func()
	// Logger receives write and reopen failures; nil: slog.Default().
	Logger *slog.Logger
}

// Logger is an audit log. Its methods are safe for concurrent use; a nil
// *Logger logs nothing, so a gateway without an audit log needs no checks.
//
// Write failures. The writer gathers lines in a buffer of about 64 KiB
// and writes them with one Write when the queue is empty or the buffer is
// full. When that write fails, the lines it did not get through whole are
// lost, each of their records counted once (OnDrop, Dropped): the record
// the write stopped inside too (unless only its newline is missing), as
// its line cannot be read. Nothing is written twice, and the next records
// are written as usual. A write that failed part-way (a short write: a
// full disk, a quota, NFS) leaves the first bytes of a line in the file,
// a torn line; the next write then starts with a newline, so the torn line
// stays alone on its line (one line a reader skips as not JSON) and the
// records after it are whole lines. The same holds for the last write to
// the old file at a Reopen, and for a file that already ends in a torn
// line when it is opened (at start, or reopened without a rotation).
type Logger struct {
	path   string // "" when the writer was given (New): Reopen does nothing
	queue  chan item
	onDrop func()
	log    *slog.Logger

	mu     sync.RWMutex // held for reading while sending to queue, for writing to close it
	closed bool
	// stop is closed when Close starts, before it waits for mu: a request
	// waiting for room in the queue holds mu for reading and gives up
	// then, so that Close, and every Log behind Close's wait (a waiting
	// writer lets no new reader in), wait for no stalled write.
	stop     chan struct{}
	stopOnce sync.Once

	dropped   atomic.Int64
	done      chan struct{} // closed when the writer has finished
	final     error         // what Close returns, set by the writer before done
	abandoned atomic.Bool   // Close gave up waiting for the writer

	// owned by the writer goroutine
	file    *os.File     // nil unless the Logger opened it
	base    io.Writer    // what lines are written to: file, or the writer given
	buf     bytes.Buffer // whole lines, after a newline ending a torn line in base (see restart)
	torn    bool         // the last byte written to base is not a newline
	last    error        // the outcome of the last write, for finish
	failing bool         // the last write failed: the next success is logged
}

// bufSize is the size of the writer's buffer: it writes when it holds
// this much, and whenever the queue is empty.
const bufSize = 64 << 10

// item is a record to write, or a request to the writer (ack set).
type item struct {
	rec    Record
	reopen bool
	ack    chan error
}

// Open opens the audit log at path for appending (created 0600 if absent),
// or standard output when path is Stdout. An error names the path.
func Open(path string, opts *Options) (*Logger, error) {
	if path == Stdout {
		return New(os.Stdout, opts), nil
	}
	f, err := openFile(path)
	if err != nil {
		return nil, err
	}
	l := newLogger(f, opts)
	l.path, l.file = path, f
	l.torn = !endsLine(f)
	l.restart()
	go l.run()
	return l, nil
}

// New returns a Logger writing to w, which Reopen leaves as it is and Close
// does not close.
func New(w io.Writer, opts *Options) *Logger {
	l := newLogger(w, opts)
	go l.run()
	return l
}

func newLogger(w io.Writer, opts *Options) *Logger {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	l := &Logger{queue: make(chan item, o.Buffer), onDrop: o.OnDrop, log: o.Logger,
		done: make(chan struct{}), stop: make(chan struct{}), base: w}
	l.buf.Grow(bufSize + 4<<10)
	return l
}

func openFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: cannot open %s: %w", path, err)
	}
	return f, nil
}

// endsLine reports whether a line appended to f starts a line of its own:
// f is empty or ends in a newline. A file that is not a regular one (a
// pipe, a terminal), or that cannot be read, is taken to.
func endsLine(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return true
	}
	r, err := os.Open(f.Name()) // f is write-only
	if err != nil {
		return true
	}
	defer r.Close()
	if rfi, err := r.Stat(); err != nil || !os.SameFile(fi, rfi) {
		return true
	}
	var b [1]byte
	if _, err := r.ReadAt(b[:], fi.Size()-1); err != nil {
		return true
	}
	return b[0] == '\n'
}

// Log queues rec for writing and returns at once. When the buffer is full,
// or the Logger is closed, rec is dropped and counted. Its fields are first
// cut to MaxField and MaxArguments.
func (l *Logger) Log(rec Record) {
	if l == nil {
		return
	}
	bound(&rec)
	l.mu.RLock()
	sent := false
	if !l.closed {
		select {
		case l.queue <- item{rec: rec}:
			sent = true
		default:
		}
	}
	l.mu.RUnlock()
	if !sent {
		l.drop()
	}
}

// Dropped is the number of records lost so far (buffer full, closed, or a
// failed write).
func (l *Logger) Dropped() int64 {
	if l == nil {
		return 0
	}
	return l.dropped.Load()
}

func (l *Logger) drop() { l.dropN(1) }

// dropN counts n records lost: OnDrop is called for each.
func (l *Logger) dropN(n int) {
	if n <= 0 {
		return
	}
	l.dropped.Add(int64(n))
	if l.onDrop != nil {
		for range n {
			l.onDrop()
		}
	}
}

// Flush waits until every record logged before it is written to the file
// (not synced to disk), or ctx ends.
func (l *Logger) Flush(ctx context.Context) error {
	return l.request(ctx, item{})
}

// Reopen writes the records queued before it to the current file, then
// opens the path again: after the file was renamed (rotated), new lines go
// to a new file at the path. When the path cannot be opened, the old file
// stays in use and the error is returned. A Logger writing to standard
// output or a given writer has nothing to reopen.
func (l *Logger) Reopen(ctx context.Context) error {
	if l == nil || l.path == "" {
		return nil
	}
	return l.request(ctx, item{reopen: true})
}

// request hands it to the writer and waits for its answer. The send may
// wait for room in the buffer (it is not on a request path), holding the
// read lock, which keeps the queue open; a Close ends that wait (stop), as
// Close, and every Log behind it, would otherwise wait for it.
func (l *Logger) request(ctx context.Context, it item) error {
	if l == nil {
		return nil
	}
	it.ack = make(chan error, 1)
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return ErrClosed
	}
	select {
	case l.queue <- it:
	case <-ctx.Done():
		l.mu.RUnlock()
		return ctx.Err()
	case <-l.stop:
		l.mu.RUnlock()
		return ErrClosed
	}
	l.mu.RUnlock()
	select {
	case err := <-it.ack:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting records, writes those queued, and closes the file
// the Logger opened. It returns the error of that final write (its records
// were lost and counted) or of the close. Later calls return nil.
//
// Close waits for the writer at most closeWait: the gateway's shutdown
// waits for it, and a write on a stalled disk (a hung network mount) may
// never return. Past that, it logs, drops and counts the records still
// queued, answers the requests among them ErrClosed, and returns
// ErrStalled. The writer then writes no record it takes from the queue,
// and closes the file itself once its write returns: closing it here,
// under a write or a Reopen in progress, would race with them.
func (l *Logger) Close() error {
	if l == nil {
		return nil
	}
	l.stopOnce.Do(func() { close(l.stop) })
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.queue)
	l.mu.Unlock()
	wait := time.NewTimer(closeWait)
	defer wait.Stop()
	select {
	case <-l.done:
		return l.final
	case <-wait.C:
	}
	l.abandoned.Store(true)
	n := 0
	for it := range l.queue { // the writer may take some too: each is discarded once
		n += l.discard(it)
	}
	l.log.Error("audit log not closed: its writer is stuck on a write (a stalled disk?); the records still queued are dropped",
		"path", l.path, "waited", closeWait, "dropped", n)
	return fmt.Errorf("%w: Close gave up after %v, %d queued records dropped", ErrStalled, closeWait, n)
}

// discard drops it unwritten: a record is counted (and returns 1), a
// request is answered ErrClosed.
func (l *Logger) discard(it item) int {
	if it.ack != nil {
		it.ack <- ErrClosed
		return 0
	}
	l.drop()
	return 1
}

// run is the writer: it encodes records into its buffer and writes it
// whenever the queue is empty or the buffer full, so lines reach the file
// promptly under light load and in batches under heavy load. Once Close
// gave up waiting for it (abandoned), it discards what it takes. When the
// queue is closed and empty it finishes: see finish.
func (l *Logger) run() {
	defer close(l.done)
	for it := range l.queue {
		switch {
		case l.abandoned.Load():
			l.discard(it)
			continue
		case it.ack != nil && it.reopen:
			it.ack <- l.reopen()
			continue
		case it.ack != nil:
			it.ack <- l.flush()
			continue
		}
		// The encoder writes nothing unless the whole line was encoded.
		if err := encode(&l.buf, it.rec); err != nil {
			l.log.Error("audit record cannot be encoded", "err", err)
			l.drop()
		}
		if len(l.queue) == 0 || l.buf.Len() >= bufSize {
			l.flush()
		}
	}
	l.final = l.finish()
}

// finish ends the writer's work once the queue is closed and empty: it
// writes what the buffer still holds (only the newline ending a torn line,
// unless Close gave up while records taken before were buffered), so that
// the file ends in a whole line, and closes the file the Logger opened. It
// returns the last write's error (its records were lost and counted) or
// the close's.
func (l *Logger) finish() error {
	err := l.last
	if l.buf.Len() > 0 {
		if ferr := l.flush(); err == nil {
			err = ferr
		}
	}
	if l.file != nil {
		err = errors.Join(err, l.file.Close())
	}
	return err
}

// restart empties the buffer after a write. When the last byte written is
// not a newline (a write failed in the middle of a line), the buffer starts
// with one: the next write ends the torn line before its first record.
func (l *Logger) restart() {
	l.buf.Reset()
	if l.torn {
		l.buf.WriteByte('\n')
	}
}

// flush writes the buffer with one Write, and empties it whatever the
// outcome. When the write fails, the records it did not write whole are
// lost and counted, none is written again, and whether the file now ends
// in a torn line is remembered.
func (l *Logger) flush() error {
	if l.buf.Len() == 0 {
		return nil
	}
	p := l.buf.Bytes()
	n, err := l.base.Write(p)
	n = max(0, min(n, len(p)))
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if n > 0 {
		l.torn = p[n-1] != '\n'
	}
	lost := 0
	if n < len(p) {
		// Each record is one line, its only newline at its end (a leading
		// separator is at index 0, never past n): the records lost are
		// the newlines after p[n]. A record whole but for its newline, at
		// p[n], is not lost: the next write adds the newline (torn).
		lost = bytes.Count(p[n+1:], []byte{'\n'})
	}
	l.restart()
	l.wrote(err, lost)
	return err
}

// wrote counts the records a write lost and logs the changes between
// failing and working (not every failure: a full disk would flood the
// log).
func (l *Logger) wrote(err error, lost int) {
	l.last = err
	switch {
	case err != nil && !l.failing:
		l.failing = true
		l.log.Error("audit log write failed: records are dropped until writes succeed",
			"path", l.path, "err", err, "dropped", lost, "torn_line", l.torn)
	case err == nil && l.failing:
		l.failing = false
		l.log.Info("audit log writes succeed again", "path", l.path)
	}
	l.dropN(lost)
}

// reopen flushes to the old file, then swaps in the file now at the path.
func (l *Logger) reopen() error {
	l.flush()
	f, err := openFile(l.path)
	if err != nil {
		l.log.Error("audit log cannot be reopened: still writing to the file opened before", "err", err)
		return err
	}
	old := l.file
	l.file, l.base = f, f
	// The new file may be the same one (no rotation happened), ending in
	// a line the last write tore, or another.
	l.torn = !endsLine(f)
	l.restart()
	if cerr := old.Close(); cerr != nil {
		l.log.Warn("closing the previous audit file failed", "path", l.path, "err", cerr)
	}
	return nil
}

// encode writes rec as one line. The encoder escapes control characters
// and replaces invalid UTF-8 in strings, and compacts raw arguments (no
// newline survives). Raw arguments are valid JSON (the gateway parsed them)
// but may carry invalid UTF-8 inside their strings, which is replaced the
// same way first; arguments that are not JSON at all are left out.
func encode(buf *bytes.Buffer, rec Record) error {
	rec.Time = rec.Time.UTC()
	if len(rec.Arguments) > 0 {
		if !utf8.Valid(rec.Arguments) {
			rec.Arguments = bytes.ToValidUTF8(rec.Arguments, []byte("\uFFFD"))
		}
		if !json.Valid(rec.Arguments) {
			rec.Arguments = nil
		}
	}
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	return enc.Encode(rec) // ends the line with '\n'
}
