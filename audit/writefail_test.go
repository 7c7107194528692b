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
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var errNoSpace = errors.New("no space left on device")

// shortWriter passes writes to w until told to fail one: that write puts
// only its first cut bytes through (cut < 0: half of them) and returns
// errNoSpace, as a filling disk, a quota or NFS does. With a gate, its
// first write waits until the gate is opened (and then succeeds), so that
// the test can queue records behind it and know they are written together.
type shortWriter struct {
	mu   sync.Mutex
	w    io.Writer
	fail bool
	cut  int

	entered chan struct{} // closed when the first write started (with a gate)
	gate    chan struct{} // nil: no gate
	once    sync.Once
}

func (s *shortWriter) failNext(cut int) {
	s.mu.Lock()
	s.fail, s.cut = true, cut
	s.mu.Unlock()
}

func (s *shortWriter) Write(p []byte) (int, error) {
	first := false
	if s.gate != nil {
		s.once.Do(func() { first = true; close(s.entered); <-s.gate })
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if first || !s.fail {
		return s.w.Write(p)
	}
	s.fail = false
	n := s.cut
	if n < 0 {
		n = len(p) / 2
	}
	n = min(n, len(p))
	m, err := s.w.Write(p[:n])
	if err != nil {
		return m, err
	}
	return m, errNoSpace
}

// syncBuffer is a bytes.Buffer safe to read while the writer goroutine
// writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// split cuts data into lines and sorts them into the request ids of the
// lines that are JSON records and the count of those that are not.
func split(data []byte) (ids []string, bad int) {
	if len(data) == 0 {
		return nil, 0
	}
	for _, ln := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		var rec Record
		if err := json.Unmarshal([]byte(ln), &rec); err != nil {
			bad++
			continue
		}
		ids = append(ids, rec.RequestID)
	}
	return ids, bad
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A write that fails part-way (a short write: a full disk, a quota, NFS)
// has put part of a line in the file. That torn line must stay alone on
// its line: the next record starts on a fresh line instead of being glued
// to the half line, where it would be lost too. And every record the
// failure lost, the torn one included (it cannot be read), is counted
// once in OnDrop: the reviewer's case, 50 records behind a write that
// fails half-way, then one after.
func TestShortWriteDoesNotTearLines(t *testing.T) {
	var buf syncBuffer
	w := &shortWriter{w: &buf}
	var drops atomic.Int64
	l := New(w, &Options{Logger: quiet(), OnDrop: func() { drops.Add(1) }})
	w.failNext(-1)
	const n = 50
	for i := range n {
		l.Log(Record{Time: time.Now(), RequestID: fmt.Sprint(i), Tenant: "acme", Method: "tools/call", Tool: "t", Decision: "admitted"})
	}
	if err := l.Flush(context.Background()); err != nil {
		t.Logf("flush: %v", err) // the failure may or may not be this flush's
	}
	l.Log(Record{Time: time.Now(), RequestID: "after", Tenant: "after", Method: "tools/call", Tool: "t", Decision: "admitted"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ids, bad := split(buf.Bytes())
	if bad > 1 { // 0 when the half of the write ended on a line's end
		t.Errorf("%d lines are not JSON, want at most the torn line:\n%s", bad, buf.Bytes())
	}
	if len(ids) == 0 || ids[len(ids)-1] != "after" {
		t.Errorf("the record logged after the failure is not the last line: %v", ids)
	}
	if lost := n + 1 - len(ids); int64(lost) != drops.Load() || l.Dropped() != drops.Load() {
		t.Errorf("%d records lost but OnDrop counts %d (Dropped %d)", lost, drops.Load(), l.Dropped())
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Errorf("record %s written twice", id)
		}
		seen[id] = true
	}
}

// lineLen is the encoded length of rec.
func lineLen(t *testing.T, rec Record) int {
	t.Helper()
	var b bytes.Buffer
	if err := encode(&b, rec); err != nil {
		t.Fatal(err)
	}
	return b.Len()
}

// A batch of ten records written by one failing write: the records the
// write got through whole are kept, the torn one and those after it are
// lost and each counted, and the next line starts on its own line. A write
// that stopped on a line boundary (or wrote nothing) leaves no torn line.
func TestShortWriteCountsEveryLostRecord(t *testing.T) {
	rec := func(id string) Record { return Record{RequestID: id, Tenant: "acme", Decision: "admitted"} }
	size := lineLen(t, rec("r00"))
	for _, tc := range []struct {
		name string
		cut  int // bytes of the batch written before the failure
		kept int // records of the batch written whole
		torn bool
	}{
		{"nothing written", 0, 0, false},
		{"inside the first record", size / 2, 0, true},
		{"on a line boundary", 2 * size, 2, false},
		{"inside the third record", 2*size + size/2, 2, true},
		{"inside the last record", 10*size - 2, 9, true},
		// The last record is whole but for its newline: the next write
		// starts with one, so the record is kept, not counted as lost.
		{"but the last newline", 10*size - 1, 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf syncBuffer
			w := &shortWriter{w: &buf, entered: make(chan struct{}), gate: make(chan struct{})}
			var drops atomic.Int64
			l := New(w, &Options{Logger: quiet(), OnDrop: func() { drops.Add(1) }})
			l.Log(rec("first"))
			<-w.entered // the writer is in the write of "first": the next ten queue up
			for i := range 10 {
				l.Log(rec(fmt.Sprintf("r%02d", i)))
			}
			w.failNext(tc.cut) // the write of the ten, in one batch
			close(w.gate)
			_ = l.Flush(context.Background()) // the batch's write fails, in this flush or just before it
			l.Log(rec("after"))
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			ids, bad := split(buf.Bytes())
			want := []string{"first"}
			for i := range tc.kept {
				want = append(want, fmt.Sprintf("r%02d", i))
			}
			want = append(want, "after")
			if fmt.Sprint(ids) != fmt.Sprint(want) {
				t.Errorf("records written %v, want %v", ids, want)
			}
			if wantBad := map[bool]int{true: 1}[tc.torn]; bad != wantBad {
				t.Errorf("%d lines are not JSON, want %d:\n%s", bad, wantBad, buf.Bytes())
			}
			if lost := int64(10 - tc.kept); drops.Load() != lost || l.Dropped() != lost {
				t.Errorf("OnDrop counted %d (Dropped %d), want the %d records lost", drops.Load(), l.Dropped(), lost)
			}
		})
	}
}

// The final write to the old file at a reopen (rotation) may fail part-way
// too: the records it lost are each counted, and the new file starts clean.
func TestReopenAfterShortWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	var drops atomic.Int64
	l, err := Open(path, &Options{Logger: quiet(), OnDrop: func() { drops.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	rec := func(id string) Record { return Record{RequestID: id, Decision: "admitted"} }
	size := lineLen(t, rec("r0"))
	// Set before the first record is sent: the writer goroutine reads it
	// only after receiving one.
	w := &shortWriter{w: l.file, entered: make(chan struct{}), gate: make(chan struct{})}
	l.base = w
	l.Log(rec("first"))
	<-w.entered
	for i := range 5 {
		l.Log(rec(fmt.Sprintf("r%d", i)))
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reopened := make(chan error, 1)
	go func() { reopened <- l.Reopen(ctx) }()
	for len(l.queue) < 6 { // the five records and the reopen
		time.Sleep(time.Millisecond)
	}
	w.failNext(2*size + size/2) // the reopen's write of r0..r4 to the old file
	close(w.gate)
	if err := <-reopened; err != nil {
		t.Fatal(err)
	}
	l.Log(rec("after"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	old, bad := split(readFile(t, path+".1"))
	if fmt.Sprint(old) != "[first r0 r1]" || bad != 1 {
		t.Errorf("rotated file: records %v and %d torn lines, want [first r0 r1] and 1", old, bad)
	}
	cur, bad := split(readFile(t, path))
	if fmt.Sprint(cur) != "[after]" || bad != 0 {
		t.Errorf("new file: records %v and %d bad lines, want [after] and none", cur, bad)
	}
	if drops.Load() != 3 {
		t.Errorf("OnDrop counted %d, want the 3 records lost (r2 torn, r3, r4)", drops.Load())
	}
}

// A reopen without a rotation (a SIGHUP or a config reload) opens the same
// file again, and so does a restart after a failure: when that file ends
// in a torn line, the next record still starts on a fresh line.
func TestReopenSameFileAfterShortWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	var drops atomic.Int64
	l, err := Open(path, &Options{Logger: quiet(), OnDrop: func() { drops.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	w := &shortWriter{w: l.file}
	w.failNext(-1)
	l.base = w // before the first record: see TestReopenAfterShortWrite
	l.Log(Record{RequestID: "torn"})
	ctx := context.Background()
	_ = l.Flush(ctx) // fails, or the write before it did
	if err := l.Reopen(ctx); err != nil {
		t.Fatal(err)
	}
	l.Log(Record{RequestID: "after reopen"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart: the file still ends in the torn line of a failed write.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"request_id":"torn again`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l, err = Open(path, &Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	l.Log(Record{RequestID: "after restart"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ids, bad := split(readFile(t, path))
	if fmt.Sprint(ids) != "[after reopen after restart]" || bad != 2 {
		t.Errorf("records %v and %d torn lines, want [after reopen after restart] and 2:\n%s", ids, bad, readFile(t, path))
	}
	if drops.Load() != 1 {
		t.Errorf("OnDrop counted %d, want 1 (the torn record)", drops.Load())
	}
}

// BenchmarkLog measures the writer: records logged and written (to
// io.Discard) in batches, a Flush every 256 records keeping the queue from
// overflowing.
func BenchmarkLog(b *testing.B) {
	l := New(io.Discard, &Options{Logger: quiet()})
	rec := Record{Time: time.Now(), RequestID: "0123456789abcdef", Tenant: "acme", Subject: "bob", Method: "tools/call",
		Tool: "search", Decision: "admitted", Rule: "per_tool", Cost: 3, LatencyMS: 12.5, Status: 200, Upstream: "ok"}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Log(rec)
		if i++; i%256 == 0 {
			_ = l.Flush(ctx)
		}
	}
	_ = l.Close()
	if l.Dropped() > 0 {
		b.Fatalf("%d dropped", l.Dropped())
	}
}
