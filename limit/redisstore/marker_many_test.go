package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// A metered take with an op and many checks: Lua 5.1's unpack (and the C
// stack a call's arguments take) stops at LUAI_MAXCSTACK (8000) values, so
// a reply of 2000 checks (8007 values) cannot be struct-packed; its marker
// is written as text, which has no such bound (packed, the record failed
// after the checks and the meter were charged). No limit on the number of
// checks is documented (limit.Validate).
func TestMarkerManyChecks(t *testing.T) {
	_, _, s := startStore(t)
	ctx := ctxT(t)
	rules := make([]limit.Rule, 2000)
	for i := range rules {
		rules[i] = rule("r"+strconv.Itoa(i), limit.FixedWindow, 10, time.Hour)
	}
	checks := tenantChecks("many", rules...)
	m := testMeter("many", 0)
	m.Op = limit.NewOp()
	d, mr, err := s.TakeMetered(ctx, checks, m, 1)
	if err != nil || !d.Allowed || !mr.Allowed {
		after, _, rerr := s.ReadMeter(ctx, m.Key)
		t.Fatalf("metered take of 2000 checks with an op: %v, %+v, %v (meter now %+v, %v)", d.Allowed, mr, err, after.Live, rerr)
	}
	d2, mr2, err := s.TakeMetered(ctx, checks, m, 1)
	if err != nil || d2.Remaining != d.Remaining || mr2 != mr {
		t.Errorf("the op placed again: %+v, %v; want %+v", mr2, err, mr)
	}
}
