//go:build unix

package enforce_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// heldPut is a usage store whose next Put, once armed, waits until it is
// released: a flush caught between reading a meter and writing it.
type heldPut struct {
	usage.Store
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (h *heldPut) Put(ctx context.Context, recs []usage.Record) error {
	h.mu.Lock()
	armed := h.armed
	h.armed = false
	h.mu.Unlock()
	if armed {
		close(h.entered)
		<-h.release
	}
	return h.Store.Put(ctx, recs)
}

// Two instances on one redis-server. Instance 1 reads its tenant's meter
// (20 calls, 10 of them durable) and, while its write is on the way,
// redis-server loses its data; instance 2 re-creates the meter from the
// durable 10 and charges more calls. Instance 1's late mark must not cover
// the new counter's own calls, and what instance 1 charged in the lost
// counter must be placed again: the durable total ends at every call made.
func TestMeterReplacedWhileFlushing(t *testing.T) {
	cfg := parseConfig(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 2s, on_error: open}
usage: {flush_interval: 1h}
tools:
  llm: {cost: 1}
`)
	sq, err := sqlite.Open(filepath.Join(t.TempDir(), "usage.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	held := &heldPut{Store: sq, entered: make(chan struct{}), release: make(chan struct{})}
	r := testenv.StartRedis(t, nil)
	admin := r.Client(t)
	var engines []*enforce.Engine
	for _, us := range []usage.Store{held, sq} {
		client := r.Client(t)
		st, err := redisstore.New(client, &redisstore.Options{Timeout: cfg.Store.Timeout})
		if err != nil {
			t.Fatal(err)
		}
		e, err := enforce.New(enforce.Options{Config: cfg, Usage: us, Shared: st, Metrics: metrics.New(),
			Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		engines = append(engines, e)
	}
	ctx := context.Background()
	calls := func(e *enforce.Engine, n int) {
		t.Helper()
		for range n {
			tk, d := e.Admit(ctx, enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"})
			if !d.Allowed || d.Degraded != "" {
				t.Fatalf("call not admitted through the store: %+v", d)
			}
			tk.Done(ctx, enforce.Outcome{})
		}
	}
	calls(engines[0], 10)
	if err := engines[0].Flusher().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	calls(engines[0], 10) // live 20, durable 10
	held.mu.Lock()
	held.armed = true
	held.mu.Unlock()
	flushed := make(chan error, 1)
	go func() { flushed <- engines[0].Flusher().Flush(ctx) }()
	<-held.entered // instance 1 read the meter at 20; its write waits
	if err := admin.Do(ctx, admin.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	calls(engines[1], 1) // the meter re-created from the durable 10
	close(held.release)
	if err := <-flushed; err != nil {
		t.Fatalf("flush: %v", err)
	}
	calls(engines[1], 5)
	for _, e := range engines {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	rec, _, err := sq.Get(ctx, "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Calls != 26 {
		t.Errorf("durable calls = %d, want 26 (every call made)", rec.Calls)
	}
}

// gatedUsage is a usage store that, once armed, holds its next Put before
// it runs, or its next Get after it read, until released.
type gatedUsage struct {
	usage.Store
	mu       sync.Mutex
	put, get *gate
}

// gate is one held call: entered closes when the call is held, release
// lets it go on.
type gate struct{ entered, release chan struct{} }

func newGate() *gate { return &gate{make(chan struct{}), make(chan struct{})} }

// arm holds the next call through *slot and returns its gate.
func (s *gatedUsage) arm(slot **gate) *gate {
	g := newGate()
	s.mu.Lock()
	*slot = g
	s.mu.Unlock()
	return g
}

// take disarms *slot and holds the caller there when it was armed.
func (s *gatedUsage) take(slot **gate) {
	s.mu.Lock()
	g := *slot
	*slot = nil
	s.mu.Unlock()
	if g != nil {
		close(g.entered)
		<-g.release
	}
}

func (s *gatedUsage) Put(ctx context.Context, recs []usage.Record) error {
	s.take(&s.put)
	return s.Store.Put(ctx, recs)
}

func (s *gatedUsage) Get(ctx context.Context, tenant, period string) (usage.Record, bool, error) {
	rec, ok, err := s.Store.Get(ctx, tenant, period)
	s.take(&s.get)
	return rec, ok, err
}

// Instance B's flush reads the meter (3 calls) and, while its Put is in
// flight, the limit store loses its data; B's MarkFlushed then finds no
// meter. B must not take its snapshot for billed: when instance A re-created
// the meter from the durable total read before B's Put committed (0, a
// stale seed), no counter holds B's 3 calls any more. They are placed again
// on the new meter, as replays, which a seed that holds them (read after
// the Put) finds counted: every admitted call is billed once, never twice.
func TestMeterLostWhileFlushed(t *testing.T) {
	stores := []struct {
		name  string
		store func(t *testing.T) (shared limit.GuardedStore, lose func())
	}{
		{"memory", func(t *testing.T) (limit.GuardedStore, func()) {
			mem := newSwappable(t)
			return mem, mem.restartEmpty
		}},
		{"redis", func(t *testing.T) (limit.GuardedStore, func()) {
			fs, flushAll := redisFaultyStore(t)
			return fs.GuardedStore, flushAll
		}},
	}
	for _, st := range stores {
		for _, staleSeed := range []bool{true, false} {
			name := st.name + "/seed_after_the_write"
			if staleSeed {
				name = st.name + "/stale_seed"
			}
			t.Run(name, func(t *testing.T) {
				shared, lose := st.store(t)
				us := &gatedUsage{Store: openSQLite(t)}
				a := billingEngine(t, newFaultyStore(shared), "", us, time.Hour)
				b := billingEngine(t, newFaultyStore(shared), "", us, time.Hour)
				n := admitN(t, b, 3, nil)

				put := us.arm(&us.put)
				flushed := make(chan error, 1)
				go func() { flushed <- b.Flusher().Flush(context.Background()) }()
				<-put.entered // B read the meter; its Put waits
				lose()

				admitted := make(chan int64, 1)
				get := us.arm(&us.get)
				if staleSeed {
					go func() { admitted <- admitN(t, a, 1, nil) }()
					<-get.entered // A read the durable total (0) to seed the meter
				}
				close(put.release) // B's Put commits; its MarkFlushed finds no meter
				if err := <-flushed; err != nil {
					t.Fatal(err)
				}
				if !staleSeed {
					go func() { admitted <- admitN(t, a, 1, nil) }()
					<-get.entered // A read the durable total (3)
				}
				close(get.release) // A creates the meter from its seed
				n += <-admitted

				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				billed(t, a, us, n)
			})
		}
	}
}
