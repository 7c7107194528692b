package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/dynamodb"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// Gateway.Close flushes: with a flush interval that never comes, the
// durable totals equal what the upstream served as soon as Close returns —
// also usage admitted while Redis was down, kept in process, and placed on
// its meter during the shutdown.
func TestCloseFlushes(t *testing.T) {
	for _, mode := range []string{"memory", "redis", "redis down"} {
		t.Run(mode, func(t *testing.T) {
			st := openUsageDB(t, "")
			s := setup{Usage: st, Upstream: stateless, Config: "usage: {flush_interval: 1h}\n"}
			if mode != "memory" {
				s.Redis, s.Instances = testenv.StartRedis(t, nil), 2
				s.Config += redisStore
			}
			e := newEnv(t, s)
			if mode == "redis down" {
				s.Redis.Kill()
			}
			tok := token(t, "acme", "alice")
			run(8, 40, func(i int) {
				resp, err := postCtx(t.Context(), e.mcpURL(i), tok, callBody(i, "echo", map[string]any{"text": "x"}), nil)
				if err != nil || resp.Status != http.StatusOK {
					t.Errorf("call %d: %v %+v", i, err, resp)
				}
			})
			if mode == "redis down" {
				if n := e.gws[0].Engine().PendingUsage() + e.gws[1].Engine().PendingUsage(); n == 0 {
					t.Fatal("no usage pending while Redis was down")
				}
				s.Redis.Restart(t)
				eventually(t, 5*time.Second, "the store breakers to close", func() bool {
					return e.gws[0].Engine().StoreAvailable() && e.gws[1].Engine().StoreAvailable()
				})
			}
			for i := range e.gws {
				e.stop(i)
			}
			// With Redis killed, a call whose script was sent on a
			// connection that then broke cannot know that it was not
			// run: it is unmetered (see TestStoreTimeoutsNeverDoubleCount).
			// Here none ran, so the durable total misses exactly those.
			var unmetered int64
			for _, g := range e.gws {
				unmetered += int64(counterValue(t, g.metrics.Unmetered))
			}
			served := e.up.TotalCalls() - unmetered
			if got, want := durable(t, st, "acme", usage.Period(time.Now())), (limit.Usage{Charged: served, Calls: served}); got != want || e.up.TotalCalls() != 40 {
				t.Fatalf("durable right after Close = %+v, want %+v (40 served, %d unmetered)", got, want, unmetered)
			}
			if mode != "redis down" && unmetered != 0 {
				t.Fatalf("%d calls unmetered with Redis up", unmetered)
			}
		})
	}
}

// GET /admin/usage: the admin token is required; the JSON has tenant,
// period, used, quota and calls, from the live meter while it is ahead of
// the durable total.
func TestAdminUsage(t *testing.T) {
	st := openUsageDB(t, "")
	e := newEnv(t, setup{Usage: st, Upstream: stateless, Config: `
usage: {flush_interval: 1h}
default_tier: free
tiers:
  free: {monthly_quota: 100}
  pro: {monthly_quota: 0}
tools:
  search: {cost: 3}
`})
	tok := token(t, "acme", "alice")
	for i := range 5 {
		tool, args := "echo", map[string]any{"text": "x"}
		if i < 2 {
			tool, args = "search", map[string]any{"query": "q"}
		}
		if r := e.callRaw(0, tok, i, tool, args); r.Status != http.StatusOK {
			t.Fatalf("call %d: %d", i, r.Status)
		}
	}
	url := e.base[0] + "/admin/usage?tenant=acme"
	for _, bad := range []string{"", "wrong", tok} {
		if r := get(t, url, bad); r.Status != http.StatusUnauthorized || r.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("GET /admin/usage with token %q: %d %s", bad, r.Status, r.Body)
		}
	}
	period := usage.Period(time.Now())
	report := func(query string, status int) map[string]any {
		t.Helper()
		r := get(t, e.base[0]+"/admin/usage?"+query, testAdmin)
		if r.Status != status {
			t.Fatalf("GET /admin/usage?%s: %d %s", query, r.Status, r.Body)
		}
		var m map[string]any
		if err := json.Unmarshal(r.Body, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	wantFields := func(m map[string]any, want map[string]any) {
		t.Helper()
		for k, v := range want {
			if fmt.Sprint(m[k]) != fmt.Sprint(v) {
				t.Fatalf("%s = %v, want %v (in %v)", k, m[k], v, m)
			}
		}
	}
	m := report("tenant=acme", http.StatusOK)
	wantFields(m, map[string]any{"tenant": "acme", "period": period, "used": 9, "quota": 100, "calls": 5, "remaining": 91, "store": "live"})
	if err := e.gws[0].Engine().Flusher().Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	m = report("tenant=acme&period="+period, http.StatusOK)
	wantFields(m, map[string]any{"used": 9, "calls": 5, "found": true, "store": e.cfg.Usage.Store})
	if m["updated_at"] == nil {
		t.Fatalf("no updated_at once flushed: %v", m)
	}
	wantFields(report("tenant=acme&tier=pro", http.StatusOK), map[string]any{"quota": 0, "remaining": nil, "used": 9})
	wantFields(report("tenant=acme&period=2020-01", http.StatusOK), map[string]any{"used": 0, "calls": 0, "found": false})
	for _, q := range []string{"", "tenant=acme&period=2020-13", "tenant=acme&tier=nope"} {
		report(q, http.StatusBadRequest)
	}
}

// counterValue reads a counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// fakeClock is a settable Options.Now, safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.Set(t)
	return c
}

func (c *fakeClock) Now() time.Time  { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// upstreamHook runs f for every HTTP request reaching the upstream.
func upstreamHook(f func()) upstream.Options {
	return upstream.Options{Stateless: true, OnRequest: func(*http.Request) { f() }}
}

// redisStore is the store section of the tests that count exactly. The
// deadline is far above store.timeout's 25ms default: a script that times out
// under the race detector on two busy cores admits its call under on_error
// (open), unmetered, which is TestStoreTimeoutsNeverDoubleCount's subject,
// not theirs.
const redisStore = "store: {redis: \"@@REDIS@@\", timeout: 2s}\n"

// stateless is the upstream of raw calls (no initialize first), answering
// with SSE.
var stateless = upstream.Options{Stateless: true}

// openUsageDB opens and initializes an SQLite usage store at path (a new
// temporary file when ""), closed when the test ends.
func openUsageDB(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "usage.db")
	}
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st
}

// openDynamo points the standard AWS environment at a dynalite, as a
// deployment points it at DynamoDB (the SDK's own retries left on), and
// returns an initialized store of table.
func openDynamo(t *testing.T, endpoint, table string) *dynamodb.Store {
	t.Helper()
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_DYNAMODB": endpoint, "AWS_REGION": "us-east-1",
		"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "",
		"AWS_CONFIG_FILE": t.TempDir() + "/none", "AWS_SHARED_CREDENTIALS_FILE": t.TempDir() + "/none",
		"AWS_PROFILE": "", "AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	st, err := dynamodb.Open(t.Context(), table)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := st.Init(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

// durable is the durable total of tenant in period (zero when none).
func durable(t *testing.T, st usage.Store, tenant, period string) limit.Usage {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rec, _, err := st.Get(ctx, tenant, period)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Usage
}

// waitDurable waits until the durable total of tenant in period is want.
func waitDurable(t *testing.T, st usage.Store, tenant, period string, want limit.Usage) {
	t.Helper()
	var got limit.Usage
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		rec, _, err := st.Get(ctx, tenant, period)
		cancel()
		if err == nil {
			if got = rec.Usage; got == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("durable total of %s in %s = %+v (err %v), want %+v", tenant, period, got, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// live is the meter of tenant in period as instance i's store holds it.
func (e *env) live(i int, tenant, period string) limit.Usage {
	e.t.Helper()
	st, ok, err := e.gws[i].Engine().Store().ReadMeter(e.t.Context(), keyspace.Usage(tenant, period))
	if err != nil || !ok {
		e.t.Fatalf("meter of %s in %s: found %v, %v", tenant, period, ok, err)
	}
	return st.Live
}

// stop closes instance i's server, waiting for the calls in flight (and
// their cost corrections), then the Gateway: its final flush.
func (e *env) stop(i int) {
	e.t.Helper()
	e.srvs[i].Close()
	if err := e.gws[i].Close(); err != nil {
		e.t.Fatal(err)
	}
}

// checkQuotaDenial checks a monthly quota's 429 for the request with JSON
// id, made at now in a period ending at end. It may run on any goroutine.
func checkQuotaDenial(t *testing.T, r *response, id string, quota int64, now, end time.Time) {
	t.Helper()
	if r.Status != http.StatusTooManyRequests || r.Msg.Error == nil {
		t.Errorf("want the quota's 429, got %d %s", r.Status, r.Body)
		return
	}
	var d denied
	if err := json.Unmarshal(r.Msg.Error.Data, &d); err != nil {
		t.Errorf("429 data %s: %v", r.Msg.Error.Data, err)
		return
	}
	ra := strconv.FormatInt(int64(math.Ceil(end.Sub(now).Seconds())), 10)
	window := int64(end.Sub(end.AddDate(0, -1, 0)).Seconds())
	h := r.Header
	for _, c := range []struct{ what, got, want string }{
		{"id", string(r.Msg.ID), id},
		{"code", strconv.Itoa(r.Msg.Error.Code), strconv.Itoa(CodeRateLimited)},
		{"data.scope", d.Scope, "quota"},
		{"data.rule", d.Rule, "monthly_quota"},
		{"data.limit", strconv.FormatInt(d.Limit, 10), strconv.FormatInt(quota, 10)},
		{"data.retry_after_seconds", strconv.FormatInt(d.RetryAfterSeconds, 10), ra},
		{"Retry-After", h.Get("Retry-After"), ra},
		{"X-RateLimit-Limit", h.Get("X-RateLimit-Limit"), strconv.FormatInt(quota, 10)},
		{"X-RateLimit-Remaining", h.Get("X-RateLimit-Remaining"), strconv.FormatInt(d.Remaining, 10)},
		{"X-RateLimit-Reset", h.Get("X-RateLimit-Reset"), strconv.FormatInt(end.Unix(), 10)},
		{"RateLimit-Policy", h.Get("RateLimit-Policy"), fmt.Sprintf(`"monthly_quota";q=%d;w=%d`, quota, window)},
		{"RateLimit", h.Get("RateLimit"), fmt.Sprintf(`"monthly_quota";r=%d;t=%s`, d.Remaining, ra)},
	} {
		if c.got != c.want {
			t.Errorf("quota 429 %s = %q, want %q (body %s)", c.what, c.got, c.want, r.Body)
		}
	}
	if d.Remaining < 0 || d.Remaining > 2 { // no call here costs more than 3
		t.Errorf("quota 429 leaves %d units: a call that fits was denied", d.Remaining)
	}
}

// partition is a TCP proxy in front of a server that can cut the network:
// while cut it accepts connections and forwards nothing, and stalls the
// connections already open, so a client waits as it does for a host that
// vanished (rather than one that refuses connections). heal drops every
// connection and forwards again.
type partition struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	isCut  bool
	healed chan struct{}
	conns  map[net.Conn]struct{}
}

func newPartition(t *testing.T, target string) *partition {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, target: target, healed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.heal()
	})
	return p
}

func (p *partition) endpoint() string { return "http://" + p.ln.Addr().String() }

func (p *partition) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.isCut {
		p.isCut, p.healed = true, make(chan struct{})
	}
}

func (p *partition) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isCut {
		p.isCut = false
		close(p.healed)
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// track records c, reporting whether the network is cut (and when it heals).
func (p *partition) track(c net.Conn) (cut bool, healed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = struct{}{}
	return p.isCut, p.healed
}

func (p *partition) state() (cut bool, healed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isCut, p.healed
}

func (p *partition) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if cut, _ := p.track(c); cut {
			continue // held, unanswered, until heal closes it
		}
		go func() {
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.track(u)
			go p.pipe(u, c)
			p.pipe(c, u)
		}()
	}
}

// pipe copies src to dst, stalling while the network is cut.
func (p *partition) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if cut, healed := p.state(); cut {
				<-healed // heal has closed both ends
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// switchableStore is a real SQLite usage store that a test closes (an
// outage: every call fails as on a closed database) and replaces with one
// opened again on the same file (the store is back).
type switchableStore struct {
	mu sync.Mutex
	s  *sqlite.Store
}

func (w *switchableStore) cur() *sqlite.Store {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.s
}

func (w *switchableStore) swap(s *sqlite.Store) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.s = s
}

func (w *switchableStore) Init(ctx context.Context) error  { return w.cur().Init(ctx) }
func (w *switchableStore) Check(ctx context.Context) error { return w.cur().Check(ctx) }
func (w *switchableStore) Put(ctx context.Context, recs []usage.Record) error {
	return w.cur().Put(ctx, recs)
}
func (w *switchableStore) Get(ctx context.Context, tenant, period string) (usage.Record, bool, error) {
	return w.cur().Get(ctx, tenant, period)
}
func (w *switchableStore) Close() error { return w.cur().Close() }
