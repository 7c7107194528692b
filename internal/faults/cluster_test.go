package faults_test

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// clusterYAML is a gateway on a Redis Cluster: on_error closed, so that
// every 200 is a decision made in Redis and every call Redis cannot decide
// is a 503.
func clusterYAML(cl *testenv.Cluster, limit int) string {
	return fmt.Sprintf(`
store:
  redis: [%s]
  timeout: 250ms
  on_error: closed
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: %d, period: 1h}
`, strings.Join(cl.Addrs, ", "), limit)
}

// tenantSlot is the slot of tenant's echo_cap counter (every counter of a
// tenant shares it: the tenant is the hash tag).
func tenantSlot(tenant string) uint16 {
	return keyspace.Slot(keyspace.RateLimit(keyspace.PerTenantTool, "echo_cap", keyspace.Owner{Tenant: tenant, Tool: "echo"}))
}

// stamped is one answer and when it came.
type stamped struct {
	at   time.Time
	kind string
}

// traffic runs workers goroutines calling echo for tenant (pausing pause
// between calls) until stop is closed, and returns every answer.
func traffic(e *env, workers int, tenant string, pause time.Duration, stop <-chan struct{}) func() []stamped {
	tok := token(e.t, tenant, "agent")
	var mu sync.Mutex
	var out []stamped
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := e.call(w, tok, "echo", map[string]any{"text": "x"}, 10*time.Second)
				mu.Lock()
				out = append(out, stamped{time.Now(), kind(r)})
				mu.Unlock()
				time.Sleep(pause)
			}
		})
	}
	return func() []stamped {
		wg.Wait()
		sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
		return out
	}
}

// A master of the Cluster dies under traffic (SIGKILL, or SIGSTOP: hung,
// its connections open and silent, as behind a partition; three rounds,
// each time the master owning the tenant's slot): calls in the gap get
// on_error's answer (closed: 503), none hangs, and decisions resume in Redis
// once the survivors report cluster_state:ok. The time from cluster_state:ok
// to the first decision made in Redis again is logged, not asserted (it
// depends on the machine).
func TestClusterFailoverRecovery(t *testing.T) {
	leakCheck(t)
	cl := testenv.StartCluster(t)
	e := newEnv(t, opts{Config: clusterYAML(cl, 1_000_000), Instances: 2})
	const tenant = "failover-tenant"
	slot := tenantSlot(tenant)
	tok := token(t, tenant, "agent")
	eventually(t, 10*time.Second, "a first decision in Redis", func() bool {
		return e.call(0, tok, "echo", map[string]any{"text": "x"}, 10*time.Second).ok()
	})

	var recoveries []time.Duration
	for round, fault := range []string{"kill", "freeze", "kill"} {
		owner := cl.MasterOf(t, slot)
		stop := make(chan struct{})
		wait := traffic(e, 4, tenant, 2*time.Millisecond, stop)
		t.Cleanup(func() { // a failed round leaves no caller behind
			select {
			case <-stop:
			default:
				close(stop)
				wait()
			}
		})
		time.Sleep(200 * time.Millisecond)
		killed := time.Now()
		if fault == "kill" {
			cl.Nodes[owner].Kill()
		} else {
			cl.Nodes[owner].Freeze(t)
		}
		if !cl.WaitStateFail(10*time.Second, owner) {
			t.Log("no survivor reported cluster_state:fail: the failover was quicker than the poll")
		}
		stateOK := cl.WaitStateOK(t, 30*time.Second, owner)
		// Decisions must come back; keep the traffic on until they do.
		var answers []stamped
		var first time.Time
		deadline := time.Now().Add(30 * time.Second)
		for first.IsZero() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			if e.call(0, tok, "echo", map[string]any{"text": "x"}, 10*time.Second).ok() {
				time.Sleep(300 * time.Millisecond) // some traffic after the recovery
				close(stop)
				answers = wait()
				for _, a := range answers {
					if a.kind == "ok" && a.at.After(stateOK) {
						first = a.at
						break
					}
				}
				if first.IsZero() {
					t.Fatalf("round %d: a direct call was admitted but no traffic call after cluster_state:ok", round)
				}
			}
		}
		if first.IsZero() {
			close(stop)
			wait()
			t.Fatalf("round %d: no decision in Redis 30s after cluster_state:ok", round)
		}
		kinds := map[string]int{}
		var lastOKBefore time.Time
		for _, a := range answers {
			kinds[a.kind]++
			if a.kind == "ok" && a.at.Before(killed) {
				lastOKBefore = a.at
			}
		}
		rec := first.Sub(stateOK)
		recoveries = append(recoveries, rec)
		t.Logf("round %d: %s node %d (slot %d); cluster_state:ok %v after the fault; first decision in Redis %v after cluster_state:ok; gap without decisions %v; answers %v",
			round, fault, owner, slot, stateOK.Sub(killed).Round(time.Millisecond), rec.Round(time.Millisecond),
			first.Sub(lastOKBefore).Round(time.Millisecond), kinds)
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
	t.Logf("recovery after cluster_state:ok, per round: %v", recoveries)
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
	const L = 1500
	e := newEnv(t, opts{Config: clusterYAML(cl, L) + `
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
	// Go on until both tenants have spent their limit.
	eventually(t, 60*time.Second, "both tenants to reach their limit", func() bool {
		return admitted[0].Load() >= L && admitted[1].Load() >= L
	})
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
