package usage_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// swapped is a limit store whose meters can be replaced by another store's
// (a Redis that lost its data) while a flush is under way.
type swapped struct{ limit.MeteredStore }

// puttingHook is a usage store that runs hook (once) before its next Put
// commits: what happens to the limit store while the flush's write is in
// flight.
type puttingHook struct {
	usage.Store
	hook func()
}

func (s *puttingHook) Put(ctx context.Context, recs []usage.Record) error {
	if h := s.hook; h != nil {
		s.hook = nil
		h()
	}
	return s.Store.Put(ctx, recs)
}

// What a flush tells the engine (FlusherOptions.Observe) when the limit
// store loses the meter between the flush's read and its MarkFlushed. A
// meter gone must be told not found: the durable store holds the snapshot,
// but a meter re-created in the meantime from a durable total read before
// the write committed does not, and the engine's journal, told the
// snapshot durable, would drop calls that no counter holds any more.
func TestFlushObservesMeterLostWhileWritten(t *testing.T) {
	type told struct {
		found   bool
		durable limit.Usage
	}
	snapshot := limit.Usage{Charged: 9, Calls: 3}
	for _, tc := range []struct {
		name string
		// lose, when set, runs while the Put is in flight, given the
		// store holding the meters and one like it, empty.
		lose        func(t *testing.T, ms *swapped, fresh limit.MeteredStore)
		want        []told
		wantPending int // keys left tracked for the next flush
	}{
		{name: "kept", want: []told{{true, limit.Usage{}}, {true, snapshot}}},
		{name: "lost", lose: func(t *testing.T, ms *swapped, fresh limit.MeteredStore) {
			ms.MeteredStore = fresh
		}, want: []told{{true, limit.Usage{}}, {false, limit.Usage{}}}},
		{name: "lost and created anew", lose: func(t *testing.T, ms *swapped, fresh limit.MeteredStore) {
			ms.MeteredStore = fresh
			m := meter(t, "acme", period)
			m.Seeded = true
			if _, err := fresh.Adjust(t.Context(), m, limit.Usage{Charged: 3, Calls: 1}); err != nil {
				t.Fatal(err)
			}
		}, want: []told{{true, limit.Usage{}}}, wantPending: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := &swapped{newMem(t, nil)}
			st := &puttingHook{Store: newSQLite(t, "")}
			var got []told
			f := usage.NewFlusher(ms, st, &usage.FlusherOptions{Logger: quiet(),
				Observe: func(key string, found bool, _ limit.Generation, durable limit.Usage) {
					if key != keyspace.Usage("acme", period) {
						t.Errorf("told of %q", key)
					}
					got = append(got, told{found, durable})
				}})
			for range 3 {
				charge(t, ms, f, f, "acme", period, 3)
			}
			if tc.lose != nil {
				fresh := newMem(t, nil)
				st.hook = func() { tc.lose(t, ms, fresh) }
			}
			if err := f.Flush(ctxT(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("told %+v, want %+v", got, tc.want)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("told %+v, want %+v", got, tc.want)
			}
			if p := f.Pending(); p != tc.wantPending {
				t.Errorf("Pending = %d, want %d", p, tc.wantPending)
			}
			want(t, st, "acme", period, snapshot)
		})
	}
}
