package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// testMeter is a meter of tenant for period 2026-11 expiring in 40 days.
func testMeter(tenant string, quota int64) limit.Meter {
	return limit.Meter{
		Key: keyspace.Usage(tenant, "2026-11"), Tenant: tenant, Period: "2026-11",
		Quota: quota, Seeded: true, ExpireAt: time.Now().Add(40 * 24 * time.Hour),
	}
}

func hgetall(tb testing.TB, c rueidis.Client, key string) map[string]string {
	tb.Helper()
	h, err := c.Do(ctxT(tb), c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		tb.Fatalf("HGETALL %s: %v", key, err)
	}
	return h
}

// pexpiretime is the key's absolute expiry in ms since 1970 (Redis 7+).
func pexpiretime(tb testing.TB, c rueidis.Client, key string) int64 {
	tb.Helper()
	ms, err := c.Do(ctxT(tb), c.B().Arbitrary("PEXPIRETIME").Keys(key).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	return ms
}

// The meter's key expires exactly at ExpireAt (PEXPIREAT, rounded up to the
// millisecond), set by every write of the live usage in the same script and
// kept by MarkFlushed; the hash holds the documented fields.
func TestMeterExpireAt(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	m := testMeter("exp", 0)
	m.ExpireAt = time.Date(2099, 1, 2, 3, 4, 5, 600_000_001, time.UTC) // 1 ns past a ms
	if _, _, err := s.TakeMetered(ctx, nil, m, 3); err != nil {
		t.Fatal(err)
	}
	want := m.ExpireAt.UnixMilli() + 1
	if got := pexpiretime(t, c, m.Key); got != want {
		t.Errorf("PEXPIRETIME after TakeMetered = %d, want %d", got, want)
	}
	h := hgetall(t, c, m.Key)
	if g := h["g"]; !strings.HasPrefix(g, "t") || !strings.HasSuffix(g, " 0 0 0 0") {
		t.Errorf("meter generation %q, want t<now> and the seed", g)
	}
	delete(h, "g")
	wantH := map[string]string{"c": "3", "r": "0", "n": "1", "rn": "0", "fc": "0", "fr": "0", "fn": "0", "frn": "0", "t": "exp", "p": "2026-11"}
	if fmt.Sprint(h) != fmt.Sprint(wantH) {
		t.Errorf("meter hash %v, want %v", h, wantH)
	}
	m.ExpireAt = m.ExpireAt.Add(time.Hour).Truncate(time.Millisecond)
	if _, err := s.Adjust(ctx, m, limit.Usage{Refunded: 1}); err != nil {
		t.Fatal(err)
	}
	if got, want := pexpiretime(t, c, m.Key), m.ExpireAt.UnixMilli(); got != want {
		t.Errorf("PEXPIRETIME after Adjust = %d, want %d", got, want)
	}
	st, _, err := s.ReadMeter(ctx, m.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkFlushed(ctx, m.Key, st.Gen.ID, limit.Usage{Charged: 3, Calls: 1}); err != nil {
		t.Fatal(err)
	}
	if got, want := pexpiretime(t, c, m.Key), m.ExpireAt.UnixMilli(); got != want {
		t.Errorf("PEXPIRETIME after MarkFlushed = %d, want %d (kept)", got, want)
	}

	// A short-lived meter really disappears.
	short := testMeter("short", 0)
	short.ExpireAt = time.Now().Add(300 * time.Millisecond)
	if _, _, err := s.TakeMetered(ctx, nil, short, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if _, ok, err := s.ReadMeter(ctx, short.Key); ok || err != nil {
		t.Errorf("ReadMeter after ExpireAt = %v, %v; want gone", ok, err)
	}
}

// A metered batch must be in one slot: refused before any I/O.
func TestMeterCrossSlot(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	before, _ := libCalls(t, c)
	m := testMeter("alice", 10)
	checks := tenantChecks("bob", rule("fw", limit.FixedWindow, 5, time.Second))
	if _, _, err := s.TakeMetered(ctx, checks, m, 1); !errors.Is(err, ErrCrossSlot) || !strings.HasPrefix(err.Error(), "redisstore: ") {
		t.Errorf("TakeMetered across slots: %v, want ErrCrossSlot", err)
	}
	bad := m
	bad.Quota = -1
	if _, _, err := s.TakeMetered(ctx, nil, bad, 1); !errors.Is(err, limit.ErrInvalidMeter) {
		t.Errorf("TakeMetered with a bad meter: %v", err)
	}
	if _, err := s.Adjust(ctx, m, limit.Usage{Calls: -1}); !errors.Is(err, limit.ErrInvalidMeter) {
		t.Errorf("Adjust with a negative delta: %v", err)
	}
	if err := s.MarkFlushed(ctx, m.Key, "", limit.Usage{Charged: -1}); !errors.Is(err, limit.ErrInvalidMeter) {
		t.Errorf("MarkFlushed with a negative snapshot: %v", err)
	}
	if after, _ := libCalls(t, c); after != before {
		t.Errorf("refused calls ran %d scripts", after-before)
	}
	// The tenant's own counters and meter share a slot, whatever its name.
	for _, tenant := range []string{"alice", "a}b{c:d", ""} {
		m := testMeter(tenant, 10)
		if _, _, err := s.TakeMetered(ctx, tenantChecks(tenant, rule("fw", limit.FixedWindow, 5, time.Second)), m, 1); err != nil {
			t.Errorf("tenant %q: %v", tenant, err)
		}
	}
}

// A batch without a meter runs the script's take path as before: no
// meter command is run.
func TestTakeDoesNoMeterWork(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	checks := tenantChecks("plain", rule("fw", limit.FixedWindow, 100, time.Hour), rule("tb", limit.TokenBucket, 100, time.Hour))
	if _, err := s.Take(ctx, checks, 1); err != nil { // loads the script
		t.Fatal(err)
	}
	var before [3]int64
	for i, cmd := range []string{"hmget", "hset", "pexpireat"} {
		before[i], _ = commandCalls(t, c, cmd)
	}
	for range 10 {
		if _, err := s.Take(ctx, checks, 1); err != nil {
			t.Fatal(err)
		}
	}
	for i, cmd := range []string{"hmget", "hset", "pexpireat"} {
		if after, _ := commandCalls(t, c, cmd); after != before[i] {
			t.Errorf("10 plain Takes ran %s %d times", cmd, after-before[i])
		}
	}
	// and its ARGV layout is the documented one
	b := new(batch)
	b.build(opTake, 0, checks, 1, "")
	want := []string{"t 0 1", "f 100 3600000000 100", "t 100 3600000000 100"}
	if fmt.Sprint(b.args) != fmt.Sprint(want) {
		t.Errorf("Take ARGV %q, want %q", b.args, want)
	}
}

// The script's metered layout, as limit.lua documents it, called raw.
func TestMeterRawScript(t *testing.T) {
	_, c, _ := startStore(t)
	ctx := ctxT(t)
	m := testMeter("raw", 5)
	exp := fmt.Sprint(m.ExpireAt.UnixMilli())
	check := tenantChecks("raw", rule("fw", limit.FixedWindow, 10, time.Hour))[0]
	keys := []string{check.Key, m.Key}
	// op, offset, cost, lease; the check; tenant, period, seeded, expire,
	// seed x4, quota, meter cost (the check is charged 2, the meter 3)
	args := []string{"m 0 2", "f 10 3600000000 10",
		"raw", "2026-11", "1", exp, "1", "0", "1", "0", "5", "3"}
	msgs, err := rawScript.Exec(ctx, c, keys, args).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	// now, check (allowed, remaining, reset, retry), status, c, r, n, rn, generation
	arr := ints(t, msgs[:len(msgs)-1])
	gen, _ := msgs[len(msgs)-1].ToString()
	if len(arr) != 10 || arr[1] != 1 || arr[2] != 8 || fmt.Sprint(arr[5:]) != "[1 4 0 2 0]" || !strings.HasSuffix(gen, " 1 0 1 0") {
		t.Errorf("take metered reply %v %q, want the check allowed with 8 left, then status 1, usage 4 0 2 0 and the generation of seed 1 0 1 0", arr, gen)
	}
	// adjust: the meter block with quota 0 and an unused meter cost 0, then the delta
	msgs, err = rawScript.Exec(ctx, c, []string{m.Key}, []string{"a 0 0", "raw", "2026-11", "0", exp, "0", "0", "0", "0", "0", "0", "4", "1", "0", "0"}).ToArray()
	if err != nil || fmt.Sprint(ints(t, msgs[1:len(msgs)-1])) != "[1 8 1 2 0]" {
		t.Errorf("adjust reply %v, %v; want status 1 and usage 8 1 2 0", msgs, err)
	}
	arr, err = rawScript.Exec(ctx, c, []string{m.Key}, []string{"f 0 0", "8", "1", "2", "0"}).AsIntSlice()
	if err != nil || len(arr) != 2 || arr[1] != 1 {
		t.Errorf("mark flushed reply %v, %v", arr, err)
	}
	// with the snapshot's generation: marked only when it is the meter's
	gid, _, _ := strings.Cut(gen, " ")
	arr, err = rawScript.Exec(ctx, c, []string{m.Key}, []string{"f 0 0", "9", "1", "2", "0", gid}).AsIntSlice()
	if err != nil || len(arr) != 2 || arr[1] != 1 {
		t.Errorf("mark flushed reply (its generation) %v, %v", arr, err)
	}
	arr, err = rawScript.Exec(ctx, c, []string{m.Key}, []string{"f 0 0", "10", "1", "2", "0", "t1"}).AsIntSlice()
	if err != nil || len(arr) != 2 || arr[1] != 2 {
		t.Errorf("mark flushed reply (another generation) %v, %v; want 2", arr, err)
	}
	if h := hgetall(t, c, m.Key); h["fc"] != "9" {
		t.Errorf("flushed charge %q after the marks, want 9 (the other generation's mark ignored)", h["fc"])
	}
}

func ints(t *testing.T, msgs []rueidis.RedisMessage) []int64 {
	t.Helper()
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		v, err := m.AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = v
	}
	return out
}

// A call that times out on a stalled server is not replayed: the meter is
// charged at most once.
func TestMeterTimeoutNotReplayed(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--enable-debug-command", "yes"}})
	c := r.Client(t)
	other := r.Client(t)
	const timeout = 100 * time.Millisecond
	s := newStore(t, c, timeout)
	ctx := ctxT(t)
	m := testMeter("slow", 0)
	checks := tenantChecks("slow", rule("fw", limit.FixedWindow, 100, time.Hour))
	// Warmed up on a call that changes nothing: a timed-out try may land.
	warmUp(t, func() error {
		if err := s.MarkFlushed(ctx, m.Key, "", limit.Usage{}); !errors.Is(err, limit.ErrMeterMissing) {
			return err
		}
		return nil
	})
	if _, _, err := s.TakeMetered(ctx, checks, m, 1); err != nil {
		t.Fatal(err)
	}
	stalled := make(chan error, 1)
	go func() {
		stalled <- other.Do(ctx, other.B().Arbitrary("DEBUG", "SLEEP").Args("1").Build()).Error()
	}()
	time.Sleep(200 * time.Millisecond)
	if _, _, err := s.TakeMetered(ctx, checks, m, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TakeMetered on a stalled server: %v, want context.DeadlineExceeded", err)
	}
	if _, err := s.Adjust(ctx, m, limit.Usage{Charged: 10}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Adjust on a stalled server: %v, want context.DeadlineExceeded", err)
	}
	if err := <-stalled; err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let a replay, if any, arrive
	h := hgetall(t, other, m.Key)
	// each timed-out call ran at most once: c in {1, 2, 11, 12}, n in {1, 2}
	if (h["c"] != "1" && h["c"] != "2" && h["c"] != "11" && h["c"] != "12") || (h["n"] != "1" && h["n"] != "2") {
		t.Errorf("meter after two timed-out calls: %v; want each applied at most once", h)
	}
	t.Logf("meter after the timeouts: %v", h)
}

// After Redis loses its data (a restart without persistence), a meter needs
// its Seed; seeded from what was flushed, counting resumes from there.
func TestMeterDataLoss(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	s := newStore(t, r.Client(t), testTimeout)
	ctx := ctxT(t)
	m := testMeter("lost", 10)
	for range 4 {
		if d, _, err := s.TakeMetered(ctx, nil, m, 2); err != nil || !d.Allowed {
			t.Fatalf("TakeMetered: %+v, %v", d, err)
		}
	}
	st, ok, err := s.ReadMeter(ctx, m.Key)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	durable := st.Live // what a flusher wrote
	r.Restart(t)
	unseeded := m
	unseeded.Seeded = false
	var mr limit.MeterResult
	// Several successes in a row: rueidis spreads commands over several
	// connections, and each one still open to the dead server fails once.
	// An unseeded call charges nothing, so repeating it is harmless.
	for ok, deadline := 0, time.Now().Add(10*time.Second); ok < 16; time.Sleep(10 * time.Millisecond) {
		var d limit.Decision
		if d, mr, err = s.TakeMetered(ctx, nil, unseeded, 1); err == nil {
			if d.Allowed {
				t.Fatalf("unseeded call after data loss admitted: %+v", d)
			}
			ok++
			continue
		}
		ok = 0
		if time.Now().After(deadline) {
			t.Fatalf("store still failing 10s after the restart: %v", err)
		}
	}
	if !mr.NeedSeed {
		t.Fatalf("after data loss: %+v, want NeedSeed", mr)
	}
	m.Seed = durable
	if d, mr, err := s.TakeMetered(ctx, nil, m, 2); err != nil || !d.Allowed || mr.Usage != (limit.Usage{Charged: 10, Calls: 5}) {
		t.Errorf("seeded call: %+v, %+v, %v; want admitted, 10 charged in 5 calls", d, mr, err)
	}
	if d, _, _ := s.TakeMetered(ctx, nil, m, 1); d.Allowed {
		t.Error("quota exceeded after re-seeding")
	}
}

// A key of another type where a meter should be: an error, nothing
// charged; ScanMeters skips it.
func TestMeterWrongType(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	m := testMeter("wrong", 0)
	if err := c.Do(ctx, c.B().Set().Key(m.Key).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	checks := tenantChecks("wrong", rule("fw", limit.FixedWindow, 5, time.Hour))
	if _, _, err := s.TakeMetered(ctx, checks, m, 1); err == nil {
		t.Error("TakeMetered on a string key succeeded")
	}
	if n, _ := c.Do(ctx, c.B().Exists().Key(checks[0].Key).Build()).AsInt64(); n != 0 {
		t.Error("the failed metered call charged its check")
	}
	ok := testMeter("right", 0)
	if _, _, err := s.TakeMetered(ctx, nil, ok, 1); err != nil {
		t.Fatal(err)
	}
	var seen []string
	if err := s.ScanMeters(ctx, func(st limit.MeterState) error { seen = append(seen, st.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(seen) != fmt.Sprint([]string{ok.Key}) {
		t.Errorf("ScanMeters listed %q, want only %q", seen, ok.Key)
	}
}

// testClusterMeters runs on TestCluster's cluster: meters of many tenants
// land on every master, ScanMeters lists each exactly once (replicas hold
// copies), and a metered batch across slots is refused before the cluster
// client sees it.
func testClusterMeters(t *testing.T, c rueidis.Client, s *Store) {
	ctx := ctxT(t)
	const tenants = 60
	want := map[string]bool{}
	for i := range tenants {
		tenant := fmt.Sprintf("cm-%d", i)
		m := testMeter(tenant, 100)
		checks := tenantChecks(tenant, rule("fw", limit.FixedWindow, 100, time.Minute))
		if d, _, err := s.TakeMetered(ctx, checks, m, int64(i+1)); err != nil || !d.Allowed {
			t.Fatalf("tenant %d: %+v, %v", i, d, err)
		}
		want[m.Key] = true
	}
	perNode := map[string]int{}
	got := map[string]int{}
	err := s.ScanMeters(ctx, func(st limit.MeterState) error {
		if strings.HasPrefix(st.Tenant, "cm-") {
			got[st.Key]++
			var i int64
			fmt.Sscanf(st.Tenant, "cm-%d", &i)
			if st.Live != (limit.Usage{Charged: i + 1, Calls: 1}) {
				t.Errorf("%s: %+v", st.Key, st.Live)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range want {
		if got[k] != 1 {
			t.Errorf("meter %s listed %d times, want once", k, got[k])
		}
	}
	if len(got) != tenants {
		t.Errorf("ScanMeters listed %d of our meters, want %d", len(got), tenants)
	}
	for addr, n := range conformanceMasters(t, ctx, c) {
		perNode[addr] = 0
		for cursor := uint64(0); ; {
			e, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match("mcpgate:usage:{cm-*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatal(err)
			}
			perNode[addr] += len(e.Elements)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	if len(perNode) != 3 {
		t.Errorf("meters on %d masters (%v), want 3", len(perNode), perNode)
	}
	for addr, n := range perNode {
		if n == 0 {
			t.Errorf("master %s holds none of the %d meters: the scan did not cover masters", addr, tenants)
		}
	}
	m := testMeter("cm-x1", 0)
	if _, _, err := s.TakeMetered(ctx, tenantChecks("cm-x2", rule("fw", limit.FixedWindow, 5, time.Second)), m, 1); !errors.Is(err, ErrCrossSlot) {
		t.Errorf("TakeMetered across slots: %v, want ErrCrossSlot", err)
	}
}

// A scan that cannot read what it finds fails, rather than report nothing:
// as an ACL user refused HGETALL (NOPERM), ScanMeters and ListBreakers
// return the error; a key of another type (WRONGTYPE) is still skipped
// (TestMeterWrongType).
func TestScansReportRefusedReads(t *testing.T) {
	redis := testenv.StartRedis(t, nil)
	admin := redis.Client(t)
	ctx := ctxT(t)
	if err := admin.Do(ctx, admin.B().AclSetuser().Username("nohgetall").Rule("on", ">pw", "~*", "+@all", "-hgetall").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	opt := redis.ClientOption()
	opt.Username, opt.Password = "nohgetall", "pw"
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// The tests' timeout, not the 25 ms default: the first call dials and
	// loads the library, which a loaded CI machine can take longer over.
	s := newStore(t, c, testTimeout)
	if _, _, err := s.TakeMetered(ctx, nil, testMeter("refused", 0), 1); err != nil {
		t.Fatal(err)
	}
	b := testBreaker("refused", "fp")
	b.ConsecutiveFailures = 5
	if _, err := s.ReportOutcome(ctx, b, true, false); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.ScanMeters(ctx, func(limit.MeterState) error { n++; return nil }); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("ScanMeters without HGETALL: %d meters, error %v; want the NOPERM error", n, err)
	}
	if err := s.ListBreakers(ctx, func(limit.BreakerInfo) error { n++; return nil }); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("ListBreakers without HGETALL: %d listed, error %v; want the NOPERM error", n, err)
	}
}
