package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/clip"
)

func lines(t *testing.T, data []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if !utf8.Valid(sc.Bytes()) {
			t.Errorf("line is not UTF-8: %q", sc.Bytes())
		}
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		out = append(out, m)
	}
	return out
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRecordFields(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, nil)
	at := time.Date(2026, 3, 4, 5, 6, 7, 8, time.FixedZone("x", 3600))
	l.Log(Record{Time: at, RequestID: "r1", Tenant: "acme", Subject: "bob", Method: "tools/call", Tool: "search",
		Decision: "denied", Scope: "tenant_tool", Rule: "per_tool", Cost: 0, LatencyMS: 1.5, Status: 429})
	l.Log(Record{Time: at, Method: "prompts/get", Prompt: "greet", Decision: "admitted", Status: 200, Upstream: "ok",
		Arguments: json.RawMessage("{\n  \"q\": 1\n}")})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := lines(t, buf.Bytes())
	if len(got) != 2 {
		t.Fatalf("%d lines: %s", len(got), buf.Bytes())
	}
	want := map[string]any{"time": "2026-03-04T04:06:07.000000008Z", "request_id": "r1", "tenant": "acme", "subject": "bob",
		"method": "tools/call", "tool": "search", "decision": "denied", "scope": "tenant_tool", "rule": "per_tool",
		"cost": 0.0, "latency_ms": 1.5, "status": 429.0}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("%s = %v, want %v", k, got[0][k], v)
		}
	}
	for _, k := range []string{"prompt", "resource", "upstream", "cache", "arguments", "degraded"} {
		if _, ok := got[0][k]; ok {
			t.Errorf("empty %s written: %s", k, buf.Bytes())
		}
	}
	if got[1]["prompt"] != "greet" || got[1]["upstream"] != "ok" {
		t.Errorf("second line: %v", got[1])
	}
	if args, _ := got[1]["arguments"].(map[string]any); args["q"] != 1.0 {
		t.Errorf("arguments: %v", got[1]["arguments"])
	}
}

// Whatever a caller puts in its token or request, each record is one line
// of valid JSON (and valid UTF-8).
func TestHostileStrings(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, nil)
	hostile := []string{
		"a\nb", "a\r\nb", `a"b`, `a\b`, "a\x00b", "\xff\xfe", "a\u2028b", "</script>", "}\n{\"tenant\":\"forged\"",
		strings.Repeat("x", 10000),
	}
	for _, s := range hostile {
		l.Log(Record{Tenant: s, Subject: s, Tool: s, Rule: s, RequestID: s, Decision: "admitted",
			Arguments: json.RawMessage("{\"q\":\"\xff\\n\"}\n")})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != len(hostile) {
		t.Fatalf("%d newlines for %d records:\n%s", n, len(hostile), buf.Bytes())
	}
	got := lines(t, buf.Bytes())
	for i, s := range hostile {
		want := string([]rune(clip.String(s, MaxField))) // each invalid byte becomes U+FFFD
		if got[i]["tenant"] != want || got[i]["tool"] != want {
			t.Errorf("record %d: tenant %q, want %q", i, got[i]["tenant"], want)
		}
		if _, ok := got[i]["arguments"].(map[string]any); !ok {
			t.Errorf("record %d: arguments %v", i, got[i]["arguments"])
		}
	}
}

func TestOpenStdout(t *testing.T) {
	l, err := Open(Stdout, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.base != os.Stdout || l.file != nil {
		t.Errorf("Open(%q) writes to %v", Stdout, l.base)
	}
	if err := l.Reopen(context.Background()); err != nil {
		t.Errorf("Reopen of stdout: %v", err)
	}
}

func TestOpenError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "audit.log")
	_, err := Open(path, nil)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("Open(%s) = %v", path, err)
	}
}

// Simulates logrotate: rename the file, Reopen, and new lines go to a new
// file at the path while the earlier ones stay in the renamed one.
func TestReopenAfterRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	l, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Log(Record{RequestID: "before"})
	ctx := context.Background()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	l.Log(Record{RequestID: "queued before the reopen"})
	if err := l.Reopen(ctx); err != nil {
		t.Fatal(err)
	}
	l.Log(Record{RequestID: "after"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	old, cur := lines(t, readFile(t, path+".1")), lines(t, readFile(t, path))
	if len(old) != 2 || old[0]["request_id"] != "before" || old[1]["request_id"] != "queued before the reopen" {
		t.Errorf("rotated file: %v", old)
	}
	if len(cur) != 1 || cur[0]["request_id"] != "after" {
		t.Errorf("new file: %v", cur)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("new file mode: %v %v", fi.Mode(), err)
	}
}

// A reopen that fails keeps the old file.
func TestReopenFailureKeepsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "audit.log")
	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, &Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Dir(path), filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(context.Background()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Reopen = %v, want not exist", err)
	}
	l.Log(Record{RequestID: "still logged"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := lines(t, readFile(t, filepath.Join(dir, "moved", "audit.log"))); len(got) != 1 {
		t.Errorf("old file: %v", got)
	}
}

// blockingWriter blocks every Write until release is closed, and says when
// the first one started.
type blockingWriter struct {
	entered chan struct{}
	release chan struct{}
	once    atomic.Bool
	buf     bytes.Buffer
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	if b.once.CompareAndSwap(false, true) {
		close(b.entered)
	}
	<-b.release
	return b.buf.Write(p)
}

// A slow disk never blocks Log: past the buffer, records are dropped and
// counted.
func TestFullBufferDrops(t *testing.T) {
	w := &blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
	var drops atomic.Int64
	l := New(w, &Options{Buffer: 2, OnDrop: func() { drops.Add(1) }})
	l.Log(Record{RequestID: "1"})
	<-w.entered // the writer holds record 1, blocked in Write: the queue is empty
	for i := 2; i <= 5; i++ {
		l.Log(Record{RequestID: string(rune('0' + i))})
	}
	if l.Dropped() != 2 || drops.Load() != 2 {
		t.Errorf("dropped %d (OnDrop %d), want 2", l.Dropped(), drops.Load())
	}
	close(w.release)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := lines(t, w.buf.Bytes())
	if len(got) != 3 || got[0]["request_id"] != "1" || got[2]["request_id"] != "3" {
		t.Errorf("written: %v", got)
	}
}

// Log never blocks, even while a Flush (or a Reopen, on SIGHUP) waits for
// room in a queue a stalled write keeps full and a Close (SIGTERM) comes:
// the Flush used to hold the read lock for its whole wait, Close waited for
// the write lock, and from then on every Log waited too (a waiting writer
// lets no new reader in) until the Flush gave up. Now Close ends the
// Flush's wait (ErrClosed), and Log drops the record, the queue being
// full, without waiting for either.
func TestLogDoesNotWaitBehindFlushAndClose(t *testing.T) {
	w := &blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
	l := New(w, &Options{Buffer: 2, Logger: quiet()})
	closed := make(chan error, 1)
	defer func() { close(w.release); <-closed }()
	l.Log(Record{RequestID: "1"})
	<-w.entered // the writer is stuck on record 1
	l.Log(Record{RequestID: "2"})
	l.Log(Record{RequestID: "3"}) // the queue is full
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	flushed := make(chan error, 1)
	go func() { flushed <- l.Flush(ctx) }() // as ReopenAudit does, bounded by reopenWait
	time.Sleep(50 * time.Millisecond)       // the Flush waits for room
	go func() { closed <- l.Close() }()     // the shutdown
	time.Sleep(50 * time.Millisecond)       // Close waits for the Flush
	l.Log(Record{RequestID: "request path"})
	if ctx.Err() != nil {
		t.Fatal("Log returned only once the waiting Flush gave up: it waited behind the Flush and Close")
	}
	if err := <-flushed; !errors.Is(err, ErrClosed) {
		t.Errorf("Flush waiting for room when Close came = %v, want ErrClosed", err)
	}
}

// Close is bounded: behind a write that never returns (a hung network
// mount) it gives up after closeWait, counts the records still queued as
// dropped, answers a Flush waiting in the queue, and says so (ErrStalled),
// so that the gateway's shutdown ends. The writer, once its write returns,
// writes nothing more and counts nothing twice.
func TestCloseBehindAStalledWrite(t *testing.T) {
	defer func(d time.Duration) { closeWait = d }(closeWait)
	closeWait = time.Millisecond
	w := &blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
	l := New(w, &Options{Logger: quiet()})
	l.Log(Record{RequestID: "1"})
	<-w.entered // the writer is stuck on record 1
	l.Log(Record{RequestID: "2"})
	l.Log(Record{RequestID: "3"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flushed := make(chan error, 1)
	go func() { flushed <- l.Flush(ctx) }()
	for len(l.queue) < 3 { // the Flush is queued behind 2 and 3
		runtime.Gosched()
	}
	if err := l.Close(); !errors.Is(err, ErrStalled) {
		t.Fatalf("Close behind a stalled write = %v, want ErrStalled", err)
	}
	if err := <-flushed; !errors.Is(err, ErrClosed) {
		t.Errorf("Flush queued when Close gave up = %v, want ErrClosed", err)
	}
	if l.Dropped() != 2 {
		t.Errorf("dropped %d, want the 2 records still queued", l.Dropped())
	}
	close(w.release)
	<-l.done
	if got := lines(t, w.buf.Bytes()); len(got) != 1 || got[0]["request_id"] != "1" {
		t.Errorf("written after the stalled write returned: %v, want record 1 alone", got)
	}
	if l.Dropped() != 2 {
		t.Errorf("dropped %d once the writer went on, want 2 still", l.Dropped())
	}
}

// Close writes every queued record; Log after Close drops; a nil Logger
// does nothing.
func TestCloseFlushes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, &Options{Buffer: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for range 500 {
		l.Log(Record{Decision: "admitted"})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := lines(t, readFile(t, path)); len(got) != 500 {
		t.Errorf("%d lines after Close, want 500", len(got))
	}
	l.Log(Record{})
	if l.Dropped() != 1 {
		t.Errorf("Log after Close: dropped %d", l.Dropped())
	}
	if err := l.Flush(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close = %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	var nl *Logger
	nl.Log(Record{})
	if nl.Dropped() != 0 || nl.Close() != nil || nl.Reopen(context.Background()) != nil || nl.Flush(context.Background()) != nil {
		t.Error("nil Logger is not a no-op")
	}
}

// A record holds at most MaxField bytes of each string and MaxArguments of
// arguments, whatever the client sent, and keeps no reference to the
// caller's arguments (they may point into a request body).
func TestRecordBounds(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, nil)
	long := strings.Repeat("é", 1<<20)
	big := json.RawMessage(`{"q":"` + strings.Repeat("x", MaxArguments) + `"}`)
	small := json.RawMessage(`{"q":"abc"}`)
	l.Log(Record{Tenant: long, Subject: long, Method: long, Tool: long, Resource: long, Rule: long, Decision: "forbidden", Arguments: big})
	l.Log(Record{Tool: "echo", Decision: "admitted", Arguments: small})
	copy(small[6:], "XYZ") // the caller reuses its buffer
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 8*MaxField+1024 {
		t.Fatalf("%d bytes written for two records", buf.Len())
	}
	got := lines(t, buf.Bytes())
	if len(got) != 2 {
		t.Fatalf("%d lines", len(got))
	}
	for _, k := range []string{"tenant", "subject", "method", "tool", "resource", "rule"} {
		v, _ := got[0][k].(string)
		if len(v) > MaxField || !strings.HasSuffix(v, "…") || !strings.HasPrefix(long, strings.TrimSuffix(v, "…")) {
			t.Errorf("%s: %d bytes, %q…", k, len(v), v[:min(len(v), 16)])
		}
	}
	if _, ok := got[0]["arguments"]; ok || got[0]["arguments_omitted_bytes"] != float64(len(big)) {
		t.Errorf("arguments over MaxArguments: arguments %v, omitted %v; want none and %d", ok, got[0]["arguments_omitted_bytes"], len(big))
	}
	if args, _ := got[1]["arguments"].(map[string]any); args["q"] != "abc" {
		t.Errorf("small arguments written as %v, want them as logged", got[1]["arguments"])
	}
}
