package gateway

// Usage metering and monthly quotas, end to end: real gateways in front of
// the demo upstream, meters in a real redis-server or the memory store, the
// durable totals in real SQLite files or dynalite. The upstream's own call
// counter is the reference ("what was served") that the durable totals must
// match. The helpers (clock, stores, a network partition, the 429 check)
// are at the end of this file.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// Two instances share Redis and a quota of 60 cost units: a storm of cost-1
// and cost-3 calls through both is admitted exactly up to the quota, every
// denial is the quota's 429, and the upstream serves exactly what the quota
// admits.
func TestQuotaExactAcrossInstances(t *testing.T) {
	const quota = 60
	r := testenv.StartRedis(t, nil)
	st := openUsageDB(t, "")
	now := time.Date(2031, 1, 31, 23, 59, 0, 0, time.UTC) // a minute before the month ends
	end := time.Date(2031, 2, 1, 0, 0, 0, 0, time.UTC)
	clk := newClock(now)
	e := newEnv(t, setup{Redis: r, Instances: 2, Usage: st, Now: clk.Now, Upstream: stateless, Config: fmt.Sprintf(`
store: {redis: "@@REDIS@@", timeout: 2s}
usage: {flush_interval: 50ms}
default_tier: free
tiers:
  free:
    monthly_quota: %d
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 100000, period: 1m}
tools:
  search: {cost: 3}
`, quota)})
	tok := token(t, "acme", "alice")

	var (
		mu             sync.Mutex
		admitted, cost int64
		denied         int
	)
	const calls = 80 // 40 of cost 1 and 40 of cost 3: 160 units asked, 60 granted
	run(16, calls, func(i int) {
		tool, args, c := "echo", map[string]any{"text": "x"}, int64(1)
		if i%2 == 1 {
			tool, args, c = "search", map[string]any{"query": "q"}, 3
		}
		resp, err := postCtx(t.Context(), e.mcpURL(i), tok, callBody(i, tool, args), nil)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case resp.Status == http.StatusOK && resp.Msg.Result != nil:
			admitted++
			cost += c
		case resp.Status == http.StatusTooManyRequests:
			denied++
			checkQuotaDenial(t, resp, strconv.Itoa(i), quota, now, end)
		default:
			t.Errorf("call %d: %d %s", i, resp.Status, resp.Body)
		}
	})
	if cost > quota || admitted+int64(denied) != calls {
		t.Fatalf("storm: %d admitted costing %d, %d denied; want at most %d units and %d answers", admitted, cost, denied, quota, calls)
	}
	// The storm may leave a unit or two that only a cost-1 call fits.
	for i := 0; ; i++ {
		resp := e.callRaw(i, tok, "fill", "echo", map[string]any{"text": "x"})
		if resp.Status == http.StatusTooManyRequests {
			checkQuotaDenial(t, resp, `"fill"`, quota, now, end)
			break
		}
		if resp.Status != http.StatusOK || i > quota {
			t.Fatalf("fill call %d: %d %s", i, resp.Status, resp.Body)
		}
		admitted++
		cost++
	}
	served := e.up.Calls("echo") + 3*e.up.Calls("search")
	if cost != quota || served != quota || e.up.TotalCalls() != admitted {
		t.Fatalf("admitted %d calls costing %d; upstream served %d calls costing %d; want cost %d on both sides (meter %+v)",
			admitted, cost, e.up.TotalCalls(), served, quota, e.live(0, "acme", "2031-01"))
	}
	want := limit.Usage{Charged: quota, Calls: admitted}
	for i := range e.gws {
		if got := e.live(i, "acme", "2031-01"); got != want {
			t.Fatalf("live meter seen by instance %d = %+v, want %+v", i, got, want)
		}
	}
	// The denial tracks the clock: 30 s later, 30 s are left.
	clk.Set(now.Add(30 * time.Second))
	resp := e.callRaw(1, tok, 1000, "search", map[string]any{"query": "q"})
	checkQuotaDenial(t, resp, "1000", quota, now.Add(30*time.Second), end)
	if ra := resp.Header.Get("Retry-After"); ra != "30" {
		t.Fatalf("Retry-After 30 s before the month ends = %q", ra)
	}
	waitDurable(t, st, "acme", "2031-01", want)
}

// A tool with cost {estimate, from_result}: the estimate is charged on
// admission and corrected to the reported tokens (extra charge or refund);
// a result without the value, or with one that is not a count, keeps the
// estimate.
func TestCostFromResult(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			s := setup{Usage: openUsageDB(t, ""), Upstream: stateless, Config: `
usage: {flush_interval: 50ms}
tools:
  llm_complete: {cost: {estimate: 150, from_result: _meta.usage.tokens}}
  echo: {cost: {estimate: 150, from_result: _meta.usage.tokens}}        # reports nothing
  search: {cost: {estimate: 150, from_result: structuredContent.query}} # reports a string
`}
			if store == "redis" {
				s.Redis, s.Instances = testenv.StartRedis(t, nil), 2
				s.Config += redisStore
				s.Upstream.JSONResponse = true // Answer read from both kinds of answer
			}
			e := newEnv(t, s)
			tok := token(t, "acme", "alice")
			const llmCalls, otherCalls = 40, 10
			tokens := func(i int) int64 {
				if i%4 == 0 {
					return 150 // exactly the estimate: no correction
				}
				return 1 + int64(i*97%600) // both sides of 150
			}
			var want limit.Usage
			for i := range llmCalls {
				n := tokens(i)
				want.Charged += 150 + max(0, n-150)
				want.Refunded += max(0, 150-n)
				want.Calls++
			}
			want.Charged += otherCalls * 150
			want.Calls += otherCalls
			run(8, llmCalls+otherCalls, func(i int) {
				tool, args := "llm_complete", map[string]any{"prompt": "p", "tokens": tokens(i)}
				if i >= llmCalls {
					tool, args = "echo", map[string]any{"text": "x"}
					if i%2 == 0 {
						tool, args = "search", map[string]any{"query": "q"}
					}
				}
				resp, err := postCtx(t.Context(), e.mcpURL(i), tok, callBody(i, tool, args), nil)
				if err != nil || resp.Status != http.StatusOK || resp.Msg.Result == nil {
					t.Errorf("call %d (%s): %v %+v", i, tool, err, resp)
				}
			})
			for i := range e.gws {
				e.srvs[i].Close() // the corrections run as each call ends: wait for them
			}
			if got := e.live(0, "acme", usage.Period(time.Now())); got != want {
				t.Fatalf("live meter = %+v (used %d), want %+v (used %d)", got, got.Used(), want, want.Used())
			}
			var sum int64
			for i := range llmCalls {
				sum += tokens(i)
			}
			if want.Used() != sum+otherCalls*150 {
				t.Fatalf("test arithmetic: %d != %d", want.Used(), sum+otherCalls*150)
			}
			for outcome, n := range map[string]float64{"applied": llmCalls * 3 / 4, "unchanged": llmCalls / 4, "invalid": otherCalls} {
				var got float64
				for _, g := range e.gws {
					got += counterValue(t, g.metrics.CostCorrections.WithLabelValues(outcome))
				}
				if got != n {
					t.Errorf("cost corrections %s = %v, want %v", outcome, got, n)
				}
			}
			for i := range e.gws {
				e.stop(i)
			}
			if got := durable(t, s.Usage, "acme", usage.Period(time.Now())); got != want {
				t.Fatalf("durable = %+v, want %+v", got, want)
			}
		})
	}
}

// The usage store is down for a while (an SQLite store closed, then opened
// again on its file; dynalite killed, then restarted) while calls go on: no
// call waits for it or is refused, also not a new tenant's whose meter needs
// the durable total, and once it is back the totals are exact.
func TestUsageStoreDownThenBack(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		path := t.TempDir() + "/usage.db"
		sw := &switchableStore{s: openUsageDB(t, path)}
		testStoreOutage(t, setup{Usage: sw},
			func() { sw.cur().Close() },
			func() { sw.swap(openUsageDB(t, path)) })
	})
	t.Run("dynamodb", func(t *testing.T) {
		d := testenv.StartDynaliteServer(t)
		st := openDynamo(t, d.Endpoint, "usage_outage")
		testStoreOutage(t, setup{Usage: st, Redis: testenv.StartRedis(t, nil), Config: redisStore},
			func() { d.Kill(t) },
			func() { d.Restart(t) })
	})
	// A dead server refuses connections at once; a partitioned one lets
	// requests hang. Neither may hold a call.
	t.Run("dynamodb partitioned", func(t *testing.T) {
		d := testenv.StartDynaliteServer(t)
		p := newPartition(t, strings.TrimPrefix(d.Endpoint, "http://"))
		st := openDynamo(t, p.endpoint(), "usage_partition")
		testStoreOutage(t, setup{Usage: st, Redis: testenv.StartRedis(t, nil), Config: redisStore}, p.cut, p.heal)
	})
}

func testStoreOutage(t *testing.T, s setup, down, up func()) {
	s.Config += "usage: {flush_interval: 50ms}\n"
	s.Upstream = stateless
	e := newEnv(t, s)
	period := usage.Period(time.Now())
	acme, initech := token(t, "acme", "a"), token(t, "initech", "i")
	load := func(tok string, n int) time.Duration {
		var mu sync.Mutex
		var slowest time.Duration
		run(4, n, func(i int) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			start := time.Now()
			resp, err := postCtx(ctx, e.mcpURL(0), tok, callBody(i, "echo", map[string]any{"text": "x"}), nil)
			d := time.Since(start)
			if err != nil || resp.Status != http.StatusOK || resp.Msg.Result == nil {
				t.Errorf("call %d: %v %+v", i, err, resp)
			}
			mu.Lock()
			slowest = max(slowest, d)
			mu.Unlock()
		})
		return slowest
	}
	load(acme, 10)
	waitDurable(t, s.Usage, "acme", period, limit.Usage{Charged: 10, Calls: 10})

	down()
	slowest := load(acme, 20)
	// initech has no meter yet: it would be seeded from the durable total,
	// which cannot be read now; its usage waits in process.
	slowest = max(slowest, load(initech, 5))
	t.Logf("slowest call while the usage store was down: %v", slowest)
	if slowest > time.Second {
		t.Errorf("a call took %v while the usage store was down: calls must not wait for it", slowest)
	}
	if e.up.TotalCalls() != 35 {
		t.Fatalf("upstream served %d calls, want 35", e.up.TotalCalls())
	}
	// The operator is told, and the instance stays ready: calls go on.
	eventually(t, 15*time.Second, "/readyz to report the failing usage store", func() bool {
		r := get(t, e.base[0]+"/readyz", "")
		return r.Status == http.StatusOK && strings.Contains(string(r.Body), "usage store failing")
	})
	if m := scrape(t, e.base[0]); m[`mcpgate_usage_flush_failures_total{op="flush"}`] == 0 {
		t.Errorf("no flush failure counted while the usage store was down")
	}

	up()
	waitDurable(t, s.Usage, "acme", period, limit.Usage{Charged: 30, Calls: 30})
	waitDurable(t, s.Usage, "initech", period, limit.Usage{Charged: 5, Calls: 5})
	eventually(t, 15*time.Second, "/readyz to stop reporting the usage store", func() bool {
		r := get(t, e.base[0]+"/readyz", "")
		return r.Status == http.StatusOK && !strings.Contains(string(r.Body), "usage store failing")
	})
	if m := scrape(t, e.base[0]); m["mcpgate_usage_last_flush_success_timestamp_seconds"] < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("mcpgate_usage_last_flush_success_timestamp_seconds = %v, want a recent time", m["mcpgate_usage_last_flush_success_timestamp_seconds"])
	}
	load(initech, 3)
	e.stop(0)
	if n := e.gws[0].Engine().PendingUsage(); n != 0 {
		t.Fatalf("%d meters still pending after the store came back", n)
	}
	if got, want := durable(t, s.Usage, "initech", period), (limit.Usage{Charged: 8, Calls: 8}); got != want {
		t.Fatalf("initech durable = %+v, want %+v", got, want)
	}
}

// Calls on both sides of a month's end land in their own periods, and the
// quota starts again with the new month. A call admitted in January whose
// cost is corrected after midnight is corrected in January.
func TestMonthRollover(t *testing.T) {
	const quota = 10
	st := openUsageDB(t, "")
	jan := time.Date(2031, 1, 31, 23, 59, 30, 0, time.UTC)
	feb := time.Date(2031, 2, 1, 0, 0, 1, 0, time.UTC)
	clk := newClock(jan)
	var midnight sync.Once
	var crossing atomic.Bool
	e := newEnv(t, setup{Usage: st, Now: clk.Now,
		// The llm call reaches the upstream in January and its answer
		// comes back in February.
		Upstream: upstreamHook(func() {
			if crossing.Load() {
				midnight.Do(func() { clk.Set(feb) })
			}
		}),
		Config: fmt.Sprintf(`
usage: {flush_interval: 1h}
default_tier: free
tiers:
  free: {monthly_quota: %d}
tools:
  llm_complete: {cost: {estimate: 1, from_result: _meta.usage.tokens}}
`, quota)})
	tok := token(t, "acme", "alice")
	echo := func(id int) *response { return e.callRaw(0, tok, id, "echo", map[string]any{"text": "x"}) }
	for i := range quota - 1 {
		if r := echo(i); r.Status != http.StatusOK {
			t.Fatalf("January call %d: %d %s", i, r.Status, r.Body)
		}
	}
	crossing.Store(true)
	if r := e.callRaw(0, tok, "llm", "llm_complete", map[string]any{"prompt": "p", "tokens": 5}); r.Status != http.StatusOK {
		t.Fatalf("llm call: %d %s", r.Status, r.Body)
	}
	if !clk.Now().Equal(feb) {
		t.Fatal("the clock did not cross midnight during the llm call")
	}
	// February: a fresh quota.
	for i := range quota {
		if r := echo(100 + i); r.Status != http.StatusOK {
			t.Fatalf("February call %d: %d %s", i, r.Status, r.Body)
		}
	}
	r := echo(200)
	checkQuotaDenial(t, r, "200", quota, feb, time.Date(2031, 3, 1, 0, 0, 0, 0, time.UTC))
	// An instance whose clock still says January sees January's quota used
	// up (9 + 5 reported tokens).
	clk.Set(jan.Add(10 * time.Second))
	r = echo(201)
	checkQuotaDenial(t, r, "201", quota, jan.Add(10*time.Second), time.Date(2031, 2, 1, 0, 0, 0, 0, time.UTC))
	if r.Header.Get("Retry-After") != "20" {
		t.Fatalf("Retry-After = %q, want 20", r.Header.Get("Retry-After"))
	}
	e.stop(0)
	if got, want := durable(t, st, "acme", "2031-01"), (limit.Usage{Charged: 14, Calls: 10}); got != want {
		t.Fatalf("January = %+v, want %+v", got, want)
	}
	if got, want := durable(t, st, "acme", "2031-02"), (limit.Usage{Charged: quota, Calls: quota}); got != want {
		t.Fatalf("February = %+v, want %+v", got, want)
	}
	if e.up.Calls("echo") != 2*quota-1 || e.up.Calls("llm_complete") != 1 {
		t.Fatalf("upstream served %d echo and %d llm calls", e.up.Calls("echo"), e.up.Calls("llm_complete"))
	}
}

// Redis loses its data (FLUSHALL) after a flush: the live counter is
// re-seeded from the durable total, and the quota stays exact — the calls
// admitted after the loss plus the durable total are exactly the quota.
func TestRedisDataLossReseeds(t *testing.T) {
	const quota = 40
	r := testenv.StartRedis(t, nil)
	st := openUsageDB(t, "")
	e := newEnv(t, setup{Redis: r, Instances: 2, Usage: st, Upstream: stateless, Config: fmt.Sprintf(`
store: {redis: "@@REDIS@@", timeout: 2s}
usage: {flush_interval: 1h}
default_tier: free
tiers:
  free: {monthly_quota: %d}
`, quota)})
	period := usage.Period(time.Now())
	tok := token(t, "acme", "alice")
	echo := func(i int) *response { return e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"}) }
	for i := range 25 {
		if r := echo(i); r.Status != http.StatusOK {
			t.Fatalf("call %d: %d", i, r.Status)
		}
	}
	// One instance's sweep writes what both charged.
	if err := e.gws[1].Engine().Flusher().Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	flushed := durable(t, st, "acme", period)
	if flushed != (limit.Usage{Charged: 25, Calls: 25}) {
		t.Fatalf("durable after the sweep = %+v", flushed)
	}
	for i := range 5 { // charged, never flushed: Redis loses them
		if r := echo(25 + i); r.Status != http.StatusOK {
			t.Fatalf("call %d: %d", 25+i, r.Status)
		}
	}
	c := r.Client(t)
	if err := c.Do(t.Context(), c.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	after := 0
	run(12, quota, func(i int) {
		resp, err := postCtx(t.Context(), e.mcpURL(i), tok, callBody(100+i, "echo", map[string]any{"text": "x"}), nil)
		if err != nil {
			t.Error(err)
			return
		}
		switch resp.Status {
		case http.StatusOK:
			mu.Lock()
			after++
			mu.Unlock()
		case http.StatusTooManyRequests:
		default:
			t.Errorf("call %d: %d %s", i, resp.Status, resp.Body)
		}
	})
	// The 5 unflushed calls come back (each engine places again what it
	// charged and the durable store did not hold): the re-seeding engine's
	// before its decision, the other's when it meets the new meter. So
	// between quota-30 and quota-25 calls are admitted after the loss
	// (docs/design.md, "Usage and quotas", bound 4).
	if int64(after) < quota-30 || int64(after) > quota-flushed.Used() {
		t.Fatalf("after the loss %d calls were admitted on top of the durable %d and the 5 lost: want %d to %d", after, flushed.Used(), quota-30, quota-flushed.Used())
	}
	if got := e.up.TotalCalls(); got != 30+int64(after) {
		t.Fatalf("upstream served %d, want %d", got, 30+after)
	}
	e.stop(0)
	e.stop(1)
	// Every call that ran is recorded once, the 5 lost with Redis's data too.
	if got, want := durable(t, st, "acme", period), int64(30+after); got != (limit.Usage{Charged: want, Calls: want}) {
		t.Fatalf("durable = %+v, want %d calls exactly", got, want)
	}
}

// A store deadline far too short (8ms, and the race detector) makes many
// metered scripts time out; on_error: open admits those calls. A timed-out
// script may have run after its deadline: its usage stays pending with its
// operation id and is placed again with it, which the store applies once
// (see docs/design.md, "Usage and quotas"). So the meter never exceeds what
// the upstream served, and once the pending writes are placed it equals it,
// with no call counted as unmetered. Without the deadline trouble, see
// TestQuotaExactAcrossInstances.
func TestStoreTimeoutsNeverDoubleCount(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{Redis: r, Instances: 2, Usage: openUsageDB(t, ""), Upstream: stateless, Config: `
store: {redis: "@@REDIS@@", timeout: 8ms, on_error: open}
usage: {flush_interval: 50ms}
tools:
  search: {cost: 3}
`})
	tok := token(t, "acme", "alice")
	run(16, 80, func(i int) {
		tool, args := "echo", map[string]any{"text": "x"}
		if i%2 == 1 {
			tool, args = "search", map[string]any{"query": "q"}
		}
		resp, err := postCtx(t.Context(), e.mcpURL(i), tok, callBody(i, tool, args), nil)
		if err != nil || resp.Status != http.StatusOK {
			t.Errorf("call %d: %v %+v", i, err, resp)
		}
	})
	served, servedCost := e.up.TotalCalls(), e.up.Calls("echo")+3*e.up.Calls("search")
	c := r.Client(t)
	meter := func() (calls, cost int64) {
		fields, err := c.Do(t.Context(), c.B().Hgetall().Key(keyspace.Usage("acme", usage.Period(time.Now()))).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		calls, _ = strconv.ParseInt(fields["n"], 10, 64)
		cost, _ = strconv.ParseInt(fields["c"], 10, 64)
		if calls > served || cost > servedCost {
			t.Fatalf("the meter counts %d calls costing %d; the upstream served %d costing %d: counted twice", calls, cost, served, servedCost)
		}
		return calls, cost
	}
	// The writes whose answer was lost are placed again (with their op ids)
	// on the engines' ticks, once the store answers in time.
	eventually(t, 30*time.Second, "every served call on the meter", func() bool {
		calls, cost := meter()
		return calls == served && cost == servedCost
	})
	var unmetered float64
	for _, g := range e.gws {
		unmetered += counterValue(t, g.metrics.Unmetered)
	}
	if unmetered != 0 {
		t.Fatalf("%v calls counted as unmetered, want 0", unmetered)
	}
}

// Redis keeps the meters, DynamoDB the totals: a flush whose write landed
// but whose MarkFlushed was lost, flushed again twice by both instances while
// both sweep, counts once; so does a flush retried with the same snapshot.
// (usage/flusher_test.go's TestRetriedFlushDoesNotDoubleCount proves the same
// for the memory store and SQLite at the package level; usagetest's
// testMonotonic proves Put itself idempotent on both backends.)
func TestRetriedFlushNoDoubleCount(t *testing.T) {
	d := testenv.StartDynaliteServer(t)
	st := openDynamo(t, d.Endpoint, "usage_retry")
	e := newEnv(t, setup{Redis: testenv.StartRedis(t, nil), Instances: 2, Usage: st, Upstream: stateless,
		Config: redisStore + "usage: {flush_interval: 1h}\n"})
	period := usage.Period(time.Now())
	key := keyspace.Usage("acme", period)
	tok := token(t, "acme", "alice")
	calls := func(n int) {
		for i := range n {
			if r := e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
				t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
			}
		}
	}
	calls(20)
	snap := e.live(0, "acme", period)
	if err := st.Put(t.Context(), []usage.Record{{Tenant: "acme", Period: period, Usage: snap}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, g := range e.gws {
		f := g.Engine().Flusher()
		f.Track(key)
		for range 2 {
			wg.Go(func() {
				if err := f.Flush(t.Context()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Go(func() {
			if err := f.Sweep(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := durable(t, st, "acme", period); got != snap || snap != (limit.Usage{Charged: 20, Calls: 20}) {
		t.Fatalf("durable = %+v after duplicated flushes of %+v", got, snap)
	}
	calls(5)
	for range 2 {
		e.gws[0].Engine().Flusher().Track(key)
		if err := e.gws[0].Engine().Flusher().Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	e.stop(0)
	e.stop(1)
	if got := durable(t, st, "acme", period); got != (limit.Usage{Charged: 25, Calls: 25}) || e.up.TotalCalls() != 25 {
		t.Fatalf("durable = %+v, upstream served %d; want 25 both", got, e.up.TotalCalls())
	}
}
