package enforce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// newJournalMeterer is a meterer with only what record and lostLocked use.
func newJournalMeterer() *meterer {
	return &meterer{
		log:     slog.New(slog.DiscardHandler),
		stats:   metrics.New(),
		pending: make(map[string]*pendingUsage),
		journal: make(map[string]*journal),
	}
}

func charge(calls int64, gen string) (limit.Usage, limit.MeterResult) {
	delta := limit.Usage{Charged: 1, Calls: 1}
	return delta, limit.MeterResult{Allowed: true, Usage: limit.Usage{Charged: calls, Calls: calls}, Gen: limit.Generation{ID: gen}}
}

// TestJournalGenerations: the ops journaled in one generation of a meter
// are placed again, as replays of that generation, when an answer of
// another generation arrives (the store lost the meter), and when the
// meter is lost outright.
func TestJournalGenerations(t *testing.T) {
	m := newJournalMeterer()
	meter := limit.Meter{Key: "k", Tenant: "t", Period: "2026-12"}
	for i := int64(1); i <= 3; i++ {
		d, mr := charge(i, "g1")
		m.record(meter, fmt.Sprintf("op%d", i), d, mr)
	}
	if n := len(m.journal["k"].entries); n != 3 || len(m.pending) != 0 {
		t.Fatalf("after three ops of g1: %d entries, %d pending keys; want 3 and 0", n, len(m.pending))
	}

	d, mr := charge(1, "g2") // the meter was re-created: g1's ops are lost
	m.record(meter, "op4", d, mr)
	j := m.journal["k"]
	if len(j.entries) != 1 || j.gen != "g2" || j.entries[0].op != "op4" {
		t.Fatalf("journal after g2: gen %q, entries %+v; want op4 alone in g2", j.gen, j.entries)
	}
	p := m.pending["k"]
	if p == nil || len(p.ops) != 3 {
		t.Fatalf("pending after g2: %+v; want g1's three ops", p)
	}
	for i, op := range p.ops {
		want := fmt.Sprintf("op%d-r", i+1)
		if op.op != want || op.replay == nil || op.replay.Gen != "g1" || op.replay.After.Calls != int64(i+1) || op.delta.Calls != 1 {
			t.Errorf("pending op %d = %+v (replay %+v); want %s replaying g1 after %d calls", i, op, op.replay, want, i+1)
		}
	}

	m.lostLocked(j, "g2") // its own generation: nothing lost
	if len(j.entries) != 1 || len(p.ops) != 3 {
		t.Fatalf("lostLocked of the journal's own generation moved entries: %d left, %d pending", len(j.entries), len(p.ops))
	}
	m.lostLocked(j, "") // the meter is gone
	if len(j.entries) != 0 || len(p.ops) != 4 || p.ops[3].replay.Gen != "g2" {
		t.Fatalf("lostLocked(\"\"): %d entries left, pending %+v; want none left and op4 replaying g2", len(j.entries), p.ops)
	}
}

// BenchmarkJournalRecord is the cost of journaling one charge of a tenant
// whose journal already holds n entries (a hot tenant's calls between two
// flushes): it must not grow with n.
func BenchmarkJournalRecord(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			m := newJournalMeterer()
			meter := limit.Meter{Key: "k", Tenant: "t", Period: "2026-12"}
			for i := range n {
				// every answer carries its own copy of the generation, as
				// parsed from the store's reply
				d, mr := charge(int64(i+1), string([]byte("0123456789abcdef0123456789abcdef")))
				m.record(meter, "op", d, mr)
			}
			j := m.journal["k"]
			d, mr := charge(int64(n+1), string([]byte("0123456789abcdef0123456789abcdef")))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				m.record(meter, "op", d, mr)
				j.entries = j.entries[:n]
			}
		})
	}
}

// A journal the usage store no longer drains (it is down) stays bounded:
// past maxJournal entries the oldest quarter goes, counted as unmetered,
// and the newest are kept. One drained within journalStall is not trimmed
// (a hot tenant under a long flush interval).
func TestJournalBounded(t *testing.T) {
	m := newJournalMeterer()
	meter := limit.Meter{Key: "k", Tenant: "t", Period: "2026-12"}
	const calls = 3 * maxJournal
	for i := int64(1); i <= calls; i++ {
		d, mr := charge(i, "g1")
		m.record(meter, "op", d, mr)
	}
	if n := len(m.journal["k"].entries); n != calls {
		t.Fatalf("a journal drained just now was trimmed: %d of %d entries left", n, calls)
	}
	m.journal["k"].drained = time.Now().Add(-2 * m.journalStall())
	d, mr := charge(calls+1, "g1")
	m.record(meter, "op", d, mr)
	j := m.journal["k"]
	if n := len(j.entries); n != (calls+1)-(calls+1)/4 {
		t.Fatalf("%d entries after %d charges; want the newest three quarters", n, calls+1)
	}
	if last := j.entries[len(j.entries)-1].after.Calls; last != calls+1 {
		t.Fatalf("newest entry after %d calls, want %d", last, calls+1)
	}
	if first := j.entries[0].after.Calls; first != calls+1-int64(len(j.entries))+1 {
		t.Fatalf("oldest entry after %d calls: the kept entries are not the newest %d", first, len(j.entries))
	}
	if got := testutil.ToFloat64(m.stats.Unmetered); got != float64(calls+1-len(j.entries)) {
		t.Fatalf("unmetered = %v, want the %d calls dropped", got, calls+1-len(j.entries))
	}
	// Trims go on while the usage store stays stalled: the journal comes
	// down to maxJournal and stays there.
	for i := int64(calls + 2); i <= 2*calls; i++ {
		d, mr := charge(i, "g1")
		m.record(meter, "op", d, mr)
	}
	if n := len(j.entries); n > maxJournal || n < maxJournal*3/4 {
		t.Fatalf("%d entries after %d more charges with the usage store stalled; want at most %d", n, calls, maxJournal)
	}
}

// Journals the usage store no longer drains stay bounded together too:
// spread over many tenants, none reaches maxJournal, but past maxJournaled
// entries in all the oldest quarter of each stalled journal goes (counted
// as unmetered), and journals drained recently are kept whole.
func TestJournalsBoundedTogether(t *testing.T) {
	m := newJournalMeterer()
	const meters, per = 4096, maxJournaled / 4096
	stalled := time.Now().Add(-2 * m.journalStall())
	for i := range meters {
		key := fmt.Sprintf("k%d", i)
		j := &journal{meter: limit.Meter{Key: key, Tenant: key, Period: "2026-12"}, gen: "g1", drained: stalled}
		if i == 0 {
			j.drained = time.Now() // drained just now: kept whole
		}
		for c := int64(1); c <= per; c++ {
			d, mr := charge(c, "g1")
			j.entries = append(j.entries, journalEntry{op: "op", delta: d, after: mr.Usage})
		}
		m.journal[key] = j
	}
	m.journaled = meters * per
	if m.journaled != maxJournaled {
		t.Fatalf("set up %d entries, want maxJournaled", m.journaled)
	}
	d, mr := charge(per+1, "g1")
	m.record(m.journal["k1"].meter, "op", d, mr) // one more: over the bound
	total := 0
	for key, j := range m.journal {
		total += len(j.entries)
		want := per - per/4
		switch key {
		case "k0":
			want = per
		case "k1":
			want = per + 1 - (per+1+3)/4
		}
		if len(j.entries) != want {
			t.Errorf("journal %s: %d entries after the sweep, want %d", key, len(j.entries), want)
		}
		if last := j.entries[len(j.entries)-1].after.Calls; key != "k1" && last != per {
			t.Errorf("journal %s: newest entry after %d calls, want %d (the newest kept)", key, last, per)
		}
	}
	if total != m.journaled {
		t.Fatalf("journaled = %d, but the journals hold %d entries", m.journaled, total)
	}
	if dropped := maxJournaled + 1 - total; testutil.ToFloat64(m.stats.Unmetered) != float64(dropped) {
		t.Fatalf("unmetered = %v, want the %d calls dropped", testutil.ToFloat64(m.stats.Unmetered), dropped)
	}
	// The next charges do not sweep again until the journals grew by a
	// quarter of the bound.
	before := m.journaled
	for c := int64(per + 2); c < per+100; c++ {
		d, mr := charge(c, "g1")
		m.record(m.journal["k2"].meter, "op", d, mr)
	}
	if m.journaled != before+98 {
		t.Fatalf("journaled %d after 98 more charges from %d: swept again", m.journaled, before)
	}
}

// expiredStore refuses every Adjust as a store does once the meter's
// period ended longer than its grace ago.
type expiredStore struct{ *memstore.Store }

func (expiredStore) Adjust(context.Context, limit.Meter, limit.Usage) (limit.MeterResult, error) {
	return limit.MeterResult{}, fmt.Errorf("memstore: adjust: %w", limit.ErrMeterExpired)
}

// Usage that no store will ever accept is not kept and retried for ever:
// it is dropped, and its calls are counted as unmetered. Usage that fails
// for a passing reason stays pending.
func TestPendingThatCanNeverBePlaced(t *testing.T) {
	ms, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	m := newJournalMeterer()
	m.store = expiredStore{ms}
	meter := limit.Meter{Key: "k", Tenant: "t", Period: "2026-10", ExpireAt: time.Now().Add(time.Hour)}
	m.addPending(meter, limit.Usage{Charged: 3, Calls: 3}, errors.New("test"))
	m.addOp(meter, pendingOp{op: limit.NewOp(), delta: limit.Usage{Charged: 1, Calls: 1}, sent: time.Now()}, errors.New("test"))
	m.placePending(context.Background())
	if n := m.pendingCount(); n != 0 {
		t.Fatalf("%d meters still pending after a placement no store accepts", n)
	}
	if got := testutil.ToFloat64(m.stats.Unmetered); got != 4 {
		t.Fatalf("unmetered calls %v, want 4", got)
	}

	m.store = ms // a failure for a passing reason (here the caller's context) stays pending
	m.addPending(meter, limit.Usage{Charged: 1, Calls: 1}, errors.New("test"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m.placePending(ctx)
	if n := m.pendingCount(); n != 1 {
		t.Fatalf("%d meters pending after a placement that failed for a passing reason, want 1", n)
	}
}

// unreadableUsage is a usage store that cannot be reached.
type unreadableUsage struct{}

func (unreadableUsage) Init(context.Context) error                { return usage.ErrUnavailable }
func (unreadableUsage) Check(context.Context) error               { return usage.ErrUnavailable }
func (unreadableUsage) Put(context.Context, []usage.Record) error { return usage.ErrUnavailable }
func (unreadableUsage) Get(context.Context, string, string) (usage.Record, bool, error) {
	return usage.Record{}, false, usage.ErrUnavailable
}
func (unreadableUsage) Close() error { return nil }

// A correction, or pending usage, whose meter the store lost while the
// usage store cannot be read was never applied: the store answered
// NeedSeed, and the seeded write never went out. It is kept as never sent,
// so that however long the usage store stays down it is not flagged as a
// write that may count twice (and counted in
// mcpgate_unmetered_calls_total) once the op horizon has passed.
func TestUnseededWriteIsNotSent(t *testing.T) {
	ms, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	m := newMeterer(ms, unreadableUsage{}, time.Hour, slog.New(slog.DiscardHandler), metrics.New())
	meter := limit.Meter{Key: "k", Tenant: "t", Period: "2026-10", ExpireAt: time.Now().Add(time.Hour)}
	sent := func(when string) {
		t.Helper()
		m.mu.Lock()
		defer m.mu.Unlock()
		p := m.pending["k"]
		if p == nil || len(p.ops) != 1 {
			t.Fatalf("%s: pending %+v, want one op", when, p)
		}
		if !p.ops[0].sent.IsZero() {
			t.Errorf("%s: the op is kept as sent at %v, though the store applied nothing", when, p.ops[0].sent)
		}
	}
	m.adjust(context.Background(), meter, limit.Usage{Charged: 2})
	sent("a correction")
	m.mu.Lock()
	clear(m.pending)
	m.mu.Unlock()
	m.addPending(meter, limit.Usage{Charged: 3, Calls: 1}, errors.New("test"))
	m.placePending(context.Background())
	sent("pending usage placed")
}
