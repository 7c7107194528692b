package redisstore

import (
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// An op's marker is binary (struct-packed, limit.lua); a text marker, as
// earlier versions wrote it, is still read: its take is answered from it
// and charges nothing, and placed again through Adjust it is answered with
// the take's meter block and written again, as text, under the upper-case
// kind.
func TestMarkerFormats(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	for _, fn := range []bool{true, false} {
		st := s
		if !fn {
			st = newStoreOpts(t, c, &Options{Timeout: 5 * time.Second, NoFunctions: true})
		}
		tenant := "markers-" + map[bool]string{true: "fcall", false: "evalsha"}[fn]
		checks := tenantChecks(tenant, rule("fw", limit.FixedWindow, 10, time.Hour))
		marker := func(m limit.Meter) string {
			t.Helper()
			v, err := c.Do(ctx, c.B().Get().Key(keyspace.MeterOp(m.Key, m.Op)).Build()).ToString()
			if err != nil {
				t.Fatalf("marker of %s: %v", m.Op, err)
			}
			return v
		}

		m := testMeter(tenant, 0)
		m.Op = limit.NewOp()
		d1, mr1, err := st.TakeMetered(ctx, checks, m, 1)
		if err != nil || !d1.Allowed {
			t.Fatalf("take: %+v, %v", d1, err)
		}
		if v := marker(m); !strings.HasPrefix(v, "\x01m>") {
			t.Errorf("marker %q, want a binary one of kind m", v)
		}
		d2, mr2, err := st.TakeMetered(ctx, checks, m, 1)
		if err != nil || d2.Allowed != d1.Allowed || d2.Remaining != d1.Remaining || d2.Results[0].ResetAfter != d1.Results[0].ResetAfter || mr2 != mr1 {
			t.Errorf("repeated take: %+v, %+v, %v; want %+v, %+v", d2, mr2, err, d1, mr1)
		}

		// A text marker of a take that left 4 of 10, usage 7 0 3 0.
		old := m
		old.Op = limit.NewOp()
		text := "m\n218000000000000\n1\n4\n3000000\n0\n1\n7\n0\n3\n0\nt217000000000000 0 0 0 0\n"
		if err := c.Do(ctx, c.B().Set().Key(keyspace.MeterOp(old.Key, old.Op)).Value(text).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		d, mr, err := st.TakeMetered(ctx, checks, old, 1)
		if err != nil || !d.Allowed || d.Remaining != 4 || mr.Usage != (limit.Usage{Charged: 7, Calls: 3}) || mr.Gen.ID != "t217000000000000" {
			t.Errorf("take answered from a text marker: %+v, %+v, %v; want admitted, 4 left, usage 7 0 3 0", d, mr, err)
		}
		if mr, err := st.Adjust(ctx, old, limit.Usage{Charged: 1, Calls: 1}); err != nil || mr.Usage != (limit.Usage{Charged: 7, Calls: 3}) {
			t.Errorf("a text marker's take placed again through Adjust: %+v, %v; want the take's usage 7 0 3 0", mr, err)
		}
		if v := marker(old); v != "M"+text[1:] {
			t.Errorf("text marker placed again: %q, want %q", v, "M"+text[1:])
		}
		// Neither charged the meter.
		if mr, err := st.Adjust(ctx, limit.Meter{Key: m.Key, Tenant: m.Tenant, Period: m.Period, ExpireAt: m.ExpireAt}, limit.Usage{}); err != nil || mr.Usage != mr1.Usage {
			t.Errorf("meter after the text markers: %+v, %v; want %+v", mr, err, mr1.Usage)
		}
	}
}
