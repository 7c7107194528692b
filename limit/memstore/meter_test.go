package memstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

func meterOf(key string, quota int64, expireAt time.Time) limit.Meter {
	return limit.Meter{Key: key, Tenant: "t-" + key, Period: "2025-06", Quota: quota, Seeded: true, ExpireAt: expireAt}
}

// Meters count in Len, Keys and TTL, stay until their ExpireAt whatever
// they hold, and are then dropped by Sweep.
func TestMeterSweep(t *testing.T) {
	s, clk := frozen(t)
	ctx := context.Background()
	m := meterOf("u:a", 0, start.Add(time.Hour))
	c := check("a", limit.FixedWindow, 5, time.Second)
	if _, _, err := s.TakeMetered(ctx, []limit.Check{c}, m, 1); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2 || len(s.Keys()) != 2 {
		t.Fatalf("Len %d, keys %v; want the counter and the meter", s.Len(), s.Keys())
	}
	if ttl, ok := s.TTL(m.Key); !ok || ttl != time.Hour {
		t.Fatalf("TTL(meter) = %v, %v; want 1h", ttl, ok)
	}
	clk.Advance(time.Hour - time.Microsecond)
	s.Sweep()
	if s.Len() != 1 || s.Keys()[0] != m.Key {
		t.Fatalf("after the counter expired: Len %d, keys %v; want the meter only", s.Len(), s.Keys())
	}
	clk.Advance(time.Microsecond)
	if _, ok := s.TTL(m.Key); ok {
		t.Fatal("TTL of an expired meter")
	}
	s.Sweep()
	if s.Len() != 0 {
		t.Fatalf("after ExpireAt: Len %d", s.Len())
	}
}

// A canceled context charges nothing and creates nothing.
func TestMeterContextCanceled(t *testing.T) {
	s, _ := frozen(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m := meterOf("u:c", 0, start.Add(time.Hour))
	if _, _, err := s.TakeMetered(ctx, nil, m, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("TakeMetered = %v", err)
	}
	if _, err := s.Adjust(ctx, m, limit.Usage{Charged: 1}); !errors.Is(err, context.Canceled) {
		t.Errorf("Adjust = %v", err)
	}
	if _, _, err := s.ReadMeter(ctx, m.Key); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadMeter = %v", err)
	}
	if err := s.MarkFlushed(ctx, m.Key, "", limit.Usage{}); !errors.Is(err, context.Canceled) {
		t.Errorf("MarkFlushed = %v", err)
	}
	if err := s.ScanMeters(ctx, func(limit.MeterState) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("ScanMeters = %v", err)
	}
	if s.Len() != 0 {
		t.Errorf("canceled calls left %d keys", s.Len())
	}
}

// fn may call the store: ScanMeters holds no lock while it runs.
func TestScanMetersCallsBack(t *testing.T) {
	s := newStore(t, &Options{Shards: 1}) // every meter in the shard being scanned
	ctx := context.Background()
	exp := time.Now().Add(time.Hour)
	for i := range 10 {
		if _, _, err := s.TakeMetered(ctx, nil, meterOf(fmt.Sprint("u:", i), 0, exp), int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	flush := func(st limit.MeterState) error {
		n++
		return s.MarkFlushed(ctx, st.Key, st.Gen.ID, st.Live)
	}
	done := make(chan error, 1)
	go func() { done <- s.ScanMeters(ctx, flush) }()
	select {
	case err := <-done:
		if err != nil || n != 10 {
			t.Fatalf("ScanMeters: %v after %d meters, want 10", err, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ScanMeters deadlocked on a callback into the store")
	}
	n = 0
	if err := s.ScanMeters(ctx, flush); err != nil || n != 0 {
		t.Fatalf("second scan: %v, %d meters; want none left unflushed", err, n)
	}
}

// Metered batches over overlapping shards, with meters in their own shards,
// Adjusts, scans and sweeps in between, all complete; every call admitted
// is counted once.
func TestMeterNoDeadlock(t *testing.T) {
	s := newStore(t, &Options{Shards: 4})
	var keys []limit.Check
	for i := range 12 {
		keys = append(keys, check(fmt.Sprint("r", i), limit.Algorithms[i%len(limit.Algorithms)], limit.MaxSlidingWindowLimit, time.Hour))
	}
	exp := time.Now().Add(time.Hour)
	meters := make([]limit.Meter, 4)
	for i := range meters {
		meters[i] = meterOf(fmt.Sprint("u:", i), 0, exp)
	}
	var admitted [4]int64
	var adjusted [4]int64
	var mu = make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		hammer(200, func(w, i int) {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(i)))
			batch := make([]limit.Check, rng.IntN(4))
			for j, k := range rng.Perm(len(keys))[:len(batch)] {
				batch[j] = keys[k]
			}
			mi := rng.IntN(len(meters))
			switch rng.IntN(10) {
			case 0:
				if _, err := s.Adjust(ctx, meters[mi], limit.Usage{Charged: 1}); err != nil {
					t.Error(err)
				}
				mu <- struct{}{}
				adjusted[mi]++
				<-mu
			case 1:
				if err := s.ScanMeters(ctx, func(st limit.MeterState) error { return s.MarkFlushed(ctx, st.Key, st.Gen.ID, st.Live) }); err != nil {
					t.Error(err)
				}
			default:
				d, _, err := s.TakeMetered(ctx, batch, meters[mi], 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu <- struct{}{}
					admitted[mi]++
					<-mu
					if len(batch) > 0 {
						if err := s.Release(ctx, batch, d.Lease); err != nil {
							t.Error(err)
						}
					}
				}
			}
			if rng.IntN(50) == 0 {
				s.Sweep()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("deadlock: metered batches did not complete")
	}
	for i, m := range meters {
		st, ok, err := s.ReadMeter(context.Background(), m.Key)
		if admitted[i]+adjusted[i] == 0 {
			continue
		}
		if err != nil || !ok || st.Live != (limit.Usage{Charged: admitted[i] + adjusted[i], Calls: admitted[i]}) {
			t.Errorf("meter %d: %+v, %v, %v; want %d calls and %d adjusted units", i, st, ok, err, admitted[i], adjusted[i])
		}
	}
}
