package algo

import (
	"testing"

	"github.com/mcpgate/mcpgate/limit"
)

func TestMeterOpen(t *testing.T) {
	seed := limit.Usage{Charged: 9, Refunded: 1, Calls: 3}
	m := limit.Meter{Tenant: "t", Period: "p", Seed: seed, Seeded: true}
	held := &Meter{Live: limit.Usage{Charged: 1}}
	for _, tc := range []struct {
		name     string
		mt       *Meter
		seeded   bool
		now, exp int64
		created  bool
		st       MeterStatus
	}{
		{"held", held, false, 10, 11, false, MeterOK},
		{"expire time reached", held, true, 10, 10, false, MeterExpired},
		{"missing, seeded", nil, true, 10, 11, true, MeterOK},
		{"missing, not seeded", nil, false, 10, 11, false, MeterNeedSeed},
	} {
		m.Seeded = tc.seeded
		out, created, st := MeterOpen(tc.mt, m, tc.now, tc.exp)
		if created != tc.created || st != tc.st {
			t.Errorf("%s: created %v, status %d; want %v, %d", tc.name, created, st, tc.created, tc.st)
		}
		switch {
		case tc.mt != nil && st == MeterOK && out != tc.mt:
			t.Errorf("%s: a held meter was replaced", tc.name)
		case created && (out.Live != seed || out.Flushed != seed || out.Tenant != "t" || out.Period != "p" || out.ExpiresAt != tc.exp):
			t.Errorf("%s: created %+v, want the seed as live and flushed usage", tc.name, out)
		case st != MeterOK && out != nil:
			t.Errorf("%s: status %d with a meter %+v", tc.name, st, out)
		}
	}
}

func TestMeterEval(t *testing.T) {
	mt := &Meter{Live: limit.Usage{Charged: 12, Refunded: 4, Calls: 2}} // used 8
	for _, tc := range []struct {
		quota, cost int64
		want        MeterStatus
	}{
		{0, 1 << 40, MeterOK}, // no quota
		{10, 2, MeterOK},      // exactly at the quota
		{10, 3, MeterDenied},
		{8, 1, MeterDenied},
		{limit.MaxUsage, limit.MaxUsage - 12, MeterOK},
		{limit.MaxUsage, limit.MaxUsage - 11, MeterOverflow}, // charged would pass MaxUsage
	} {
		if got := MeterEval(mt, tc.quota, tc.cost); got != tc.want {
			t.Errorf("quota %d cost %d: %d, want %d", tc.quota, tc.cost, got, tc.want)
		}
	}
	full := &Meter{Live: limit.Usage{Calls: limit.MaxUsage}}
	if got := MeterEval(full, 0, 1); got != MeterOverflow {
		t.Errorf("calls at MaxUsage: %d, want overflow", got)
	}
	MeterCharge(mt, 2, 99)
	if mt.Live != (limit.Usage{Charged: 14, Refunded: 4, Calls: 3}) || mt.ExpiresAt != 99 {
		t.Errorf("after MeterCharge: %+v", mt)
	}
}

func TestMeterAdjustAndFlush(t *testing.T) {
	mt := &Meter{Live: limit.Usage{Charged: 5, Calls: 1}, ExpiresAt: 10}
	if st := MeterAdjust(mt, limit.Usage{Charged: 2, Refunded: 3, RefundedCalls: 1}, 20); st != MeterOK {
		t.Fatalf("MeterAdjust: %d", st)
	}
	if mt.Live != (limit.Usage{Charged: 7, Refunded: 3, Calls: 1, RefundedCalls: 1}) || mt.ExpiresAt != 20 {
		t.Errorf("after MeterAdjust: %+v", mt)
	}
	before := *mt
	if st := MeterAdjust(mt, limit.Usage{Refunded: limit.MaxUsage}, 30); st != MeterOverflow || *mt != before {
		t.Errorf("overflowing MeterAdjust: %d, %+v; want overflow and no change", st, mt)
	}
	if !MeterMarkFlushed(mt, "", limit.Usage{Charged: 5, Calls: 1}) || !MeterMarkFlushed(mt, "", limit.Usage{Charged: 4, Refunded: 3, Calls: 0}) {
		t.Error("MeterMarkFlushed refused the meter's own generation")
	}
	if MeterMarkFlushed(mt, "t1", limit.Usage{Charged: 9, Refunded: 9, Calls: 9}) {
		t.Error("MeterMarkFlushed marked a snapshot of another generation")
	}
	if want := (limit.Usage{Charged: 5, Refunded: 3, Calls: 1}); mt.Flushed != want || mt.ExpiresAt != 20 {
		t.Errorf("flushed %+v (expiry %d), want %+v and the expiry kept", mt.Flushed, mt.ExpiresAt, want)
	}
}
