package faults_test

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// clusterYAML is a gateway on a Redis Cluster, its store timeout timeout:
// on_error closed, so that every 200 is a decision made in Redis and every
// call Redis cannot decide is a 503.
func clusterYAML(cl *testenv.Cluster, limit int, timeout string) string {
	return fmt.Sprintf(`
store:
  redis: [%s]
  timeout: %s
  on_error: closed
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: %d, period: 1h}
`, strings.Join(cl.Addrs, ", "), timeout, limit)
}

// tenantSlot is the slot of tenant's echo_cap counter (every counter of a
// tenant shares it: the tenant is the hash tag).
func tenantSlot(tenant string) uint16 {
	return keyspace.Slot(keyspace.RateLimit(keyspace.PerTenantTool, "echo_cap", keyspace.Owner{Tenant: tenant, Tool: "echo"}))
}

// stamped is one answer: the instance that gave it, when the call was made
// and when its answer came.
type stamped struct {
	inst     int
	sent, at time.Time
	kind     string
}

// load is traffic running on the gateways (see traffic).
type load struct {
	mu    sync.Mutex
	out   []stamped
	stop  chan struct{}
	wg    sync.WaitGroup
	ended bool
}

// traffic runs workers goroutines calling echo for tenant (worker w on
// instance w%instances, pausing pause between calls) until it is ended.
func traffic(e *env, workers int, tenant string, pause time.Duration) *load {
	tok := token(e.t, tenant, "agent")
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				sent := time.Now()
				r := e.call(w, tok, "echo", map[string]any{"text": "x"}, 10*time.Second)
				l.mu.Lock()
				l.out = append(l.out, stamped{w % len(e.srvs), sent, time.Now(), kind(r)})
				l.mu.Unlock()
				time.Sleep(pause)
			}
		})
	}
	return l
}

// answers returns the answers so far, by time of answer.
func (l *load) answers() []stamped {
	l.mu.Lock()
	out := slices.Clone(l.out)
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// end stops the workers, waits for their calls in progress, and returns
// every answer. It may be called again.
func (l *load) end() []stamped {
	if !l.ended {
		l.ended = true
		close(l.stop)
		l.wg.Wait()
	}
	return l.answers()
}

// summary is what one instance answered from a point in time on.
type summary struct {
	first   time.Time      // its first admitted call (zero: none)
	lastOK  time.Time      // its last admitted call (zero: none)
	kinds   map[string]int // its answers, by kind
	slowest time.Duration  // its longest call
}

// summarize sums up, per instance of n, the answers that came after from.
func summarize(answers []stamped, n int, from time.Time) []summary {
	ss := make([]summary, n)
	for i := range ss {
		ss[i].kinds = map[string]int{}
	}
	for _, a := range answers {
		if !a.at.After(from) {
			continue
		}
		s := &ss[a.inst]
		s.kinds[a.kind]++
		s.slowest = max(s.slowest, a.at.Sub(a.sent))
		if a.kind == "ok" {
			if s.first.IsZero() {
				s.first = a.at
			}
			s.lastOK = a.at
		}
	}
	return ss
}

// admitting reports whether every instance admitted a call after from.
func admitting(l *load, n int, from time.Time) bool {
	for _, s := range summarize(l.answers(), n, from) {
		if s.first.IsZero() {
			return false
		}
	}
	return true
}

// timeline is instance inst's answers after from, in order, runs of one
// kind merged (the first 30 runs): "+12ms 503×40 (slowest 251ms), ...".
func timeline(answers []stamped, inst int, from time.Time) string {
	var runs []string
	var kind string
	var n int
	var at time.Time
	var slowest time.Duration
	flush := func() {
		if n > 0 {
			runs = append(runs, fmt.Sprintf("+%v %s×%d (slowest %v)", at.Sub(from).Round(time.Millisecond), kind, n, slowest.Round(time.Millisecond)))
		}
	}
	for _, a := range answers {
		if a.inst != inst || !a.at.After(from) {
			continue
		}
		if a.kind != kind || n == 0 {
			flush()
			kind, n, at, slowest = a.kind, 0, a.at, 0
		}
		n++
		slowest = max(slowest, a.at.Sub(a.sent))
	}
	flush()
	if len(runs) > 30 {
		runs = append(runs[:30], fmt.Sprintf("... %d runs more", len(runs)-30))
	}
	return strings.Join(runs, ", ")
}

// A master of the Cluster dies under traffic (SIGKILL, or SIGSTOP: hung,
// its connections open and silent, as behind a partition; three rounds,
// each time the master owning the tenant's slot) while every gateway
// instance admits calls: calls in the gap get on_error's answer (closed:
// 503), none hangs, and decisions resume in Redis on every instance once
// the survivors report cluster_state:ok. The traffic goes on until each
// instance has admitted a call after cluster_state:ok (for at most
// recoveryDeadline), and a little longer.
//
// Each instance has its own client and store, which find the new master on
// their own (the store watches a slot whose calls get no answer and detours
// them to the node that took it over, without waiting for rueidis's slot
// map refresh; see limit/redisstore/detour.go), and its own breaker (a
// probe every 250ms while open): the instances recover at different times,
// and a fixed wait after the first one admits proves nothing about the
// others. The time from cluster_state:ok to each instance's first decision
// in Redis is logged; the median over every round and instance must be
// within the 1s target (one slow instance on a loaded machine is logged,
// not failed).
func TestClusterFailoverRecovery(t *testing.T) {
	const (
		instances = 2
		// recoveryDeadline bounds the wait for decisions on every
		// instance, before the fault and after cluster_state:ok: far
		// above the 1s target, so that a loaded machine does not fail the
		// test, far below forever.
		recoveryDeadline = 20 * time.Second
		target           = time.Second
	)
	leakCheck(t)
	cl := testenv.StartCluster(t)
	e := newEnv(t, opts{Config: clusterYAML(cl, 1_000_000, "250ms"), Instances: instances})
	const tenant = "failover-tenant"
	slot := tenantSlot(tenant)

	var recoveries [][instances]time.Duration
	for round, fault := range []string{"kill", "freeze", "kill"} {
		owner := cl.MasterOf(t, slot)
		began := time.Now()
		l := traffic(e, 2*instances, tenant, 2*time.Millisecond)
		t.Cleanup(func() { l.end() }) // a failed round leaves no caller behind
		// Decisions in Redis on every instance before the fault.
		for deadline := began.Add(recoveryDeadline); !admitting(l, instances, began); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				var kinds []string
				for i, s := range summarize(l.end(), instances, began) {
					kinds = append(kinds, fmt.Sprintf("instance %d: %v", i, s.kinds))
				}
				t.Fatalf("round %d: before the fault, some instance admitted no call in %v; answers %s", round, recoveryDeadline, strings.Join(kinds, ", "))
			}
		}
		time.Sleep(100 * time.Millisecond)
		faulted := time.Now()
		if fault == "kill" {
			cl.Nodes[owner].Kill()
		} else {
			cl.Nodes[owner].Freeze(t)
		}
		if !cl.WaitStateFail(10*time.Second, owner) {
			t.Log("no survivor reported cluster_state:fail: the failover was quicker than the poll")
		}
		stateOK := cl.WaitStateOK(t, 30*time.Second, owner)
		// Decisions must come back on every instance; keep the traffic on
		// until they do.
		for deadline := stateOK.Add(recoveryDeadline); !admitting(l, instances, stateOK) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if admitting(l, instances, stateOK) {
			time.Sleep(300 * time.Millisecond) // some traffic after the recovery
		}
		answers := l.end()
		after := summarize(answers, instances, stateOK)
		whole := summarize(answers, instances, began)
		before := summarize(slices.DeleteFunc(slices.Clone(answers), func(a stamped) bool { return !a.at.Before(faulted) }), instances, began)
		var per []string
		failed := false
		var rec [instances]time.Duration
		for i, s := range after {
			if s.first.IsZero() {
				failed = true
				per = append(per, fmt.Sprintf("instance %d: NO decision; answers after cluster_state:ok %v, slowest call %v; timeline after cluster_state:ok: %s",
					i, s.kinds, s.slowest.Round(time.Millisecond), timeline(answers, i, stateOK)))
				continue
			}
			rec[i] = s.first.Sub(stateOK)
			per = append(per, fmt.Sprintf("instance %d: first decision %v after cluster_state:ok (no decision for %v), answers after cluster_state:ok %v, slowest call of the round %v",
				i, rec[i].Round(time.Millisecond), s.first.Sub(before[i].lastOK).Round(time.Millisecond), s.kinds, whole[i].slowest.Round(time.Millisecond)))
		}
		kinds := map[string]int{}
		for _, a := range answers {
			kinds[a.kind]++
		}
		report := fmt.Sprintf("round %d: %s node %d (slot %d); cluster_state:ok %v after the fault; answers %v;\n  %s",
			round, fault, owner, slot, stateOK.Sub(faulted).Round(time.Millisecond), kinds, strings.Join(per, ";\n  "))
		if failed {
			t.Fatalf("%s\nsome instance made no decision in Redis in the %v after cluster_state:ok", report, recoveryDeadline)
		}
		t.Log(report)
		recoveries = append(recoveries, rec)
		for i, r := range rec {
			if r > target {
				t.Logf("round %d: instance %d resumed %v after cluster_state:ok, over the %v target (logged, not asserted)", round, i, r.Round(time.Millisecond), target)
			}
		}
		for k, n := range kinds {
			if k != "ok" && k != "503" {
				t.Errorf("round %d: %d answers of kind %s: only 200 (Redis decided) and 503 (on_error closed) are expected", round, n, k)
			}
		}
		// The dead node comes back as a replica of the new master (a
		// frozen one is killed first).
		cl.Nodes[owner].Restart(t)
		eventually(t, 20*time.Second, "the restarted node to rejoin", func() bool { return cl.Healthy() == nil })
	}
	t.Logf("recovery after cluster_state:ok, per round and instance: %v", recoveries)
	var all []time.Duration
	for _, rec := range recoveries {
		all = append(all, rec[:]...)
	}
	slices.Sort(all)
	if med := all[len(all)/2]; med > target {
		t.Errorf("median recovery after cluster_state:ok %v, over the %v target", med, target)
	}
}

// The slots of two active tenants move to another master under traffic
// (CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE one key at a time, SETSLOT
// NODE: what redis-cli --cluster reshard does), the new owner having lost
// the library first (FUNCTION FLUSH): calls meet ASK, TRYAGAIN and MOVED,
// the library is loaded on the new owner, and admission stays exact: a
// limit of L admits exactly L, which is exactly what reached the upstream.
func TestClusterReshardUnderTraffic(t *testing.T) {
	leakCheck(t)
	cl := testenv.StartCluster(t)
	const L = 800 // ~60 per tenant are admitted before the moves end here: room for a far faster machine
	// A store timeout far above a round trip: a call whose answer came
	// after it would have spent a unit without being admitted, and the
	// count could not reach L (at 250 ms, two loaded CI runs stopped one
	// short of L after a 503); what this test checks is the moves'
	// redirections, not timeouts.
	e := newEnv(t, opts{Config: clusterYAML(cl, L, "2s") + `
      - {name: echo_agent, per: subject_tool, algorithm: token_bucket, limit: 1000000, period: 1m}
  search:
    limits:
      - {name: search_cap, per: tenant_tool, algorithm: sliding_window_counter, limit: 1000000, period: 1m}
      - {name: search_agent, per: subject_tool, algorithm: gcra, limit: 1000000, period: 1m}
`, Instances: 2})
	tenants := []string{"reshard-a", "reshard-b"}
	var admitted [2]atomic.Int64
	var other tally
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ti, tenant := range tenants {
		for w := range 3 {
			// A subject per caller: more keys in the tenant's slot.
			tok := token(t, tenant, fmt.Sprintf("agent-%d", w))
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					// echo is capped at L; search keeps more keys in the
					// slot busy (its own counter and the sliding window's).
					tool := "echo"
					if n%2 == 1 {
						tool = "search"
					}
					r := e.call(w, tok, tool, map[string]any{"text": "x", "query": "q"}, 10*time.Second)
					k := kind(r)
					switch {
					case tool == "echo" && k == "ok":
						admitted[ti].Add(1)
					case k == "ok" || k == "429":
					default:
						other.add(tool + ":" + k)
					}
					time.Sleep(3 * time.Millisecond)
				}
			})
		}
	}
	time.Sleep(300 * time.Millisecond)
	stopAll := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopAll)
	var moves []string
	for _, tenant := range tenants {
		slot := tenantSlot(tenant)
		from := cl.MasterOf(t, slot)
		to := (from + 1) % 3 // masters are nodes 0..2 until a failover
		if _, err := cl.Do(to, "FUNCTION", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Do(to, "SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		before := admitted[0].Load() + admitted[1].Load()
		n := cl.MoveSlot(t, slot, from, to, 1, 40*time.Millisecond)
		moves = append(moves, fmt.Sprintf("%s: slot %d, node %d -> %d, %d keys in %v, %d echo calls admitted meanwhile",
			tenant, slot, from, to, n, time.Since(began).Round(time.Millisecond), admitted[0].Load()+admitted[1].Load()-before))
		if got := cl.MasterOf(t, slot); got != to {
			t.Fatalf("slot %d is on node %d after the move, want %d", slot, got, to)
		}
	}
	for i, tenant := range tenants {
		if n := admitted[i].Load(); n >= L {
			t.Fatalf("%s spent its limit (%d) before its slot had moved: the test proves nothing, raise L", tenant, n)
		}
	}
	time.Sleep(300 * time.Millisecond)
	// Go on until both tenants have spent their limit, for as long as
	// calls keep being admitted (under -race on a loaded machine a run
	// takes from 10 s to over a minute): a count that stops short of L
	// while traffic flows is a charge never admitted nor given back.
	// Progress is counted on the tenants still short of L (one that went
	// past it does not keep the wait going); 5 minutes cap it all.
	const stalled = 20 * time.Second
	short := func() (n int64) {
		for i := range admitted {
			if a := admitted[i].Load(); a < L {
				n += a
			}
		}
		return n
	}
	progress, last, deadline := short(), time.Now(), time.Now().Add(5*time.Minute)
	for admitted[0].Load() < L || admitted[1].Load() < L {
		if n := short(); n != progress {
			progress, last = n, time.Now()
		} else if time.Since(last) > stalled || time.Now().After(deadline) {
			stopAll()
			t.Fatalf("no echo call admitted for %v (or 5 minutes passed), at %d and %d of %d; moves: %v; other answers: %v; upstream echo calls %d",
				stalled, admitted[0].Load(), admitted[1].Load(), L, moves, other.String(), e.up.Calls("echo"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	stopAll()
	t.Logf("moves: %v; answers other than 200/429 (on_error closed while the slot moved): %v", moves, other.String())
	for i, tenant := range tenants {
		if n := admitted[i].Load(); n != L {
			t.Errorf("%s: %d echo calls admitted across the move, want exactly %d", tenant, n, L)
		}
	}
	if got := e.up.Calls("echo"); got != 2*L {
		t.Errorf("upstream served %d echo calls, want exactly %d", got, 2*L)
	}
	for k, n := range other.kinds {
		if !strings.HasSuffix(k, ":503") {
			t.Errorf("%d answers %s: only 200, 429 and 503 (on_error closed) are expected", n, k)
		}
	}
	// The new owners run the library.
	for _, tenant := range tenants {
		owner := cl.MasterOf(t, tenantSlot(tenant))
		v, err := cl.Do(owner, "FUNCTION", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(fmt.Sprint(v), "mcpgate") {
			t.Errorf("node %d (new owner of %s) has no mcpgate library: %v", owner, tenant, v)
		}
	}
	if st, body := e.get(0, "/readyz"); st != http.StatusOK {
		t.Errorf("/readyz after the moves: %d %s", st, body)
	}
}
