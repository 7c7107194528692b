package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// A webhook that fails the first attempts still gets the event (retried with
// backoff); a webhook that hangs never slows a call down.
func TestBreakerWebhookDelivery(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	cfg := `
breaker:
  consecutive_failures: 1
  cooldown: 30s
  alert_webhook: %s
`
	t.Run("retried", func(t *testing.T) {
		t.Parallel()
		h := newHook(t, 2, false)
		e := newBreakerEnv(t, redis, fmt.Sprintf(cfg, h.srv.URL), upstream.Options{Stateless: true, JSONResponse: true})
		a := newAgent(t, e, "hooked", "alice", true)
		start := time.Now()
		mustPass(t, a.call(0, "fail", failArgs), "the failure")
		mustDeny(t, a.call(1, "echo", echoArgs), "breaker", "after the failure")
		ev := h.waitEvent(t, keyspace.Breaker("hooked", "subject:alice"), "hooked", "alice", "consecutive_failures", BreakerCounts{Failures: 1}, 30*time.Second)
		if got := h.attempts.Load(); got != 3 {
			t.Fatalf("webhook attempts %d, want 3 (two failures, then delivered)", got)
		}
		// backoff 250ms then 500ms before the third attempt
		if d := h.times[0].Sub(start); d < 700*time.Millisecond {
			t.Fatalf("delivered %v after the failure: no backoff between attempts", d)
		}
		t.Logf("event delivered on attempt 3, %v after the call: %+v", h.times[0].Sub(start), ev)
	})
	t.Run("hanging", func(t *testing.T) {
		t.Parallel()
		h := newHook(t, 0, true)
		e := newBreakerEnv(t, redis, fmt.Sprintf(cfg, h.srv.URL), upstream.Options{Stateless: true, JSONResponse: true})
		var worst time.Duration
		for i := range 20 {
			a := newAgent(t, e, "hanging", fmt.Sprint("agent", i), true)
			for j, tool := range []string{"fail", "echo", "echo"} {
				start := time.Now()
				r := a.call(i+j, tool, map[string]any{})
				worst = max(worst, time.Since(start))
				if j == 0 {
					mustPass(t, r, "the failure")
				} else {
					mustDeny(t, r, "breaker", "after the failure")
				}
			}
		}
		eventually(t, 5*time.Second, "the webhook to be called", func() bool { return h.attempts.Load() > 0 })
		if worst > alertTimeout/4 {
			t.Fatalf("slowest call %v with a hanging webhook (its timeout is %v): calls wait for alerts", worst, alertTimeout)
		}
		t.Logf("20 breakers opened against a hanging webhook; slowest call %v", worst)
	})
}

// GET /admin/breakers lists an open breaker; DELETE /admin/breakers/{key}
// closes it: calls pass at once on that instance, within the in-process
// hold on the other.
func TestBreakerAdmin(t *testing.T) {
	t.Parallel()
	e := newBreakerEnv(t, nil, `
breaker:
  consecutive_failures: 2
  cooldown: 30s
`, upstream.Options{Stateless: true, JSONResponse: true})
	a := newAgent(t, e, "acme", "alice", true)
	mustPass(t, a.call(0, "fail", failArgs), "failure 1")
	mustPass(t, a.call(1, "fail", failArgs), "failure 2")
	for i := range 4 {
		mustDeny(t, a.call(i, "echo", echoArgs), "breaker", "open") // both instances now hold it in process
	}
	key := keyspace.Breaker("acme", "subject:alice")
	admin := "Bearer " + testAdmin
	r := adminReq(t, http.MethodGet, e.base[1]+"/admin/breakers", admin)
	var list struct{ Breakers []breakerView }
	if err := json.Unmarshal(r.Body, &list); r.Status != http.StatusOK || err != nil {
		t.Fatalf("GET /admin/breakers: %d %s %v", r.Status, r.Body, err)
	}
	if len(list.Breakers) != 1 {
		t.Fatalf("listed %s, want one breaker", r.Body)
	}
	b := list.Breakers[0]
	if b.Key != key || b.Tenant != "acme" || b.Subject != "alice" || b.ID != "subject:alice" || b.Reason != "consecutive_failures" ||
		b.HalfOpen || b.Failures != 2 || b.Cooldown != "30s" {
		t.Fatalf("listed %+v", b)
	}
	if left := time.Until(b.Until); left < 25*time.Second || left > 31*time.Second {
		t.Fatalf("until %v is %v away, want ~30s", b.Until, left)
	}

	r = adminReq(t, http.MethodDelete, e.base[0]+"/admin/breakers/"+url.PathEscape(key), admin)
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"closed"`) {
		t.Fatalf("DELETE: %d %s", r.Status, r.Body)
	}
	deleted := time.Now()
	mustPass(t, a.call(0, "echo", echoArgs), "right after DELETE, same instance")
	eventually(t, 2*time.Second, "the other instance to let calls pass", func() bool {
		return a.call(1, "echo", echoArgs).Status == http.StatusOK
	})
	if d := time.Since(deleted); d > enforce.BreakerCacheHold+500*time.Millisecond {
		t.Fatalf("the other instance refused for %v after DELETE", d)
	}
	if r := adminReq(t, http.MethodGet, e.base[1]+"/admin/breakers", admin); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"breakers":[]`) {
		t.Fatalf("GET after DELETE: %d %s", r.Status, r.Body)
	}
	if r := adminReq(t, http.MethodDelete, e.base[1]+"/admin/breakers/"+url.PathEscape(key), admin); r.Status != http.StatusNotFound {
		t.Fatalf("second DELETE: %d %s, want 404", r.Status, r.Body)
	}
	if got := e.up.Calls("fail") + e.up.Calls("echo"); got != 4 {
		t.Fatalf("upstream saw %d calls, want 4 (2 failures, 2 after the reset)", got)
	}
}

// breaker.key tenant: one subject's loop stops its whole tenant, not others.
// breaker.key session: each MCP session has its own breaker; without a
// session id the subject's is used.
func TestBreakerKeys(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	cfg := `
breaker:
  key: %s
  consecutive_failures: 2
  cooldown: 30s
`
	t.Run("tenant", func(t *testing.T) {
		t.Parallel()
		e := newBreakerEnv(t, redis, fmt.Sprintf(cfg, "tenant"), upstream.Options{Stateless: true, JSONResponse: true})
		alice, bob := newAgent(t, e, "t1", "alice", true), newAgent(t, e, "t1", "bob", true)
		mustPass(t, alice.call(0, "fail", failArgs), "alice fails")
		mustPass(t, bob.call(1, "fail", failArgs), "bob fails") // the tenant's second failure in a row
		mustDeny(t, alice.call(0, "echo", echoArgs), "breaker", "alice")
		mustDeny(t, bob.call(1, "echo", echoArgs), "breaker", "bob")
		mustDeny(t, newAgent(t, e, "t1", "carol", true).call(0, "echo", echoArgs), "breaker", "carol of the same tenant")
		mustPass(t, newAgent(t, e, "t2", "alice", true).call(1, "echo", echoArgs), "alice of another tenant")
		listed := adminReq(t, http.MethodGet, e.base[0]+"/admin/breakers", "Bearer "+testAdmin)
		if !strings.Contains(string(listed.Body), `"id":"tenant"`) || !strings.Contains(string(listed.Body), `"key":"`+keyspace.Breaker("t1", "tenant")+`"`) {
			t.Fatalf("listed %s", listed.Body)
		}
	})
	t.Run("session", func(t *testing.T) {
		t.Parallel()
		e := newBreakerEnv(t, redis, fmt.Sprintf(cfg, "session"), upstream.Options{})
		first := newAgent(t, e, "t3", "alice", false)
		mustPass(t, first.call(0, "fail", failArgs), "failure 1")
		mustPass(t, first.call(1, "fail", failArgs), "failure 2")
		mustDeny(t, first.call(0, "echo", echoArgs), "breaker", "the session that failed")
		mustDeny(t, first.call(1, "echo", echoArgs), "breaker", "the session that failed, other instance")
		second := newAgent(t, e, "t3", "alice", false)
		mustPass(t, second.call(1, "echo", echoArgs), "another session of the same subject")
		if got := e.up.Calls("echo"); got != 1 {
			t.Fatalf("upstream saw %d echo calls, want 1", got)
		}
	})
	t.Run("session-fallback", func(t *testing.T) {
		t.Parallel()
		e := newBreakerEnv(t, redis, fmt.Sprintf(cfg, "session"), upstream.Options{Stateless: true, JSONResponse: true})
		a, b := newAgent(t, e, "t4", "alice", true), newAgent(t, e, "t4", "alice", true)
		mustPass(t, a.call(0, "fail", failArgs), "failure 1")
		mustPass(t, b.call(1, "fail", failArgs), "failure 2, another connection of the subject")
		mustDeny(t, a.call(1, "echo", echoArgs), "breaker", "the subject, no session")
		mustPass(t, newAgent(t, e, "t4", "bob", true).call(0, "echo", echoArgs), "another subject")
		listed := adminReq(t, http.MethodGet, e.base[0]+"/admin/breakers", "Bearer "+testAdmin)
		if !strings.Contains(string(listed.Body), `"key":"`+keyspace.Breaker("t4", "subject:alice")+`"`) {
			t.Fatalf("listed %s, want the subject's breaker", listed.Body)
		}
	})
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// redisCommands reads INFO commandstats: the calls of each command, INFO's
// own left out.
func redisCommands(t *testing.T, c rueidis.Client) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		var n int64
		if _, err := fmt.Sscanf(rest, "%d,", &n); err != nil {
			t.Fatalf("INFO line %q: %v", line, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// commandsSince returns the commands run since before, in total and by name.
func commandsSince(t *testing.T, c rueidis.Client, before map[string]int64) (int64, map[string]int64) {
	t.Helper()
	var total int64
	by := map[string]int64{}
	for name, n := range redisCommands(t, c) {
		if d := n - before[name]; d != 0 {
			by[name] = d
			total += d
		}
	}
	return total, by
}

// A runaway agent loops 1000 calls through both instances on a denied key
// (the denial cache answers), on an open breaker (the breaker cache
// answers), and on a denied key until consecutive_denials opens the breaker.
// Each loop costs Redis at most one command per 20 calls, counting the
// commands its scripts run (INFO commandstats). The gateways' clock stands
// still, so the in-process answers never reach their enforce.BreakerCacheHold and
// the count does not depend on how fast a loaded machine runs the loop.
// Latencies are logged, not judged: a shared machine decides them.
func TestBreakerRunawayLoop(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	const rules = `
tools:
  search:
    limits:
      - {name: search_cap, per: subject, algorithm: fixed_window, limit: 1, period: 1h}
`
	stateless := upstream.Options{Stateless: true, JSONResponse: true}
	clock := newClock(time.Now())
	newLoopEnv := func(cfg string) *env {
		return newEnv(t, setup{Redis: redis, Instances: 2, Upstream: stateless, Config: storeYAML(true) + rules + cfg, Now: clock.Now})
	}
	failures := newLoopEnv(`
breaker:
  consecutive_failures: 2
  cooldown: 1m
`)
	denials := newLoopEnv(`
breaker:
  consecutive_denials: 5
  cooldown: 1m
`)
	rc := newRedisClient(t, redis.URL)
	const calls = 1000
	// loop runs the calls; the first `first` calls must be denied with
	// scope firstScope, the others with scope "breaker".
	loop := func(name string, e *env, a *agent, tool string, first int, firstScope string) {
		t.Helper()
		upBefore := e.up.TotalCalls()
		before := redisCommands(t, rc)
		lat := make([]time.Duration, calls)
		scopes := make([]string, calls)
		body := callBody(1, tool, map[string]any{"query": "stuck"})
		for i := range calls {
			start := time.Now()
			r, err := postCtx(context.Background(), e.mcpURL(i), a.tok, body, nil)
			lat[i] = time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusTooManyRequests || r.Msg.Error == nil {
				t.Fatalf("%s: call %d: %d %s", name, i, r.Status, r.Body)
			}
			scopes[i] = r.denial(t).Scope
		}
		cmds, byName := commandsSince(t, rc, before)
		// Idle connections' keep-alive PINGs come with time, not calls.
		cmds -= byName["ping"]
		for i, sc := range scopes {
			want := "breaker"
			if i < first {
				want = firstScope
			}
			if sc != want {
				t.Fatalf("%s: call %d denied with scope %q, want %q (scopes %v...)", name, i, sc, want, scopes[:min(calls, first+3)])
			}
		}
		slices.Sort(lat)
		t.Logf("%s: %d calls, %d Redis commands %v, p50 %v, p99 %v, max %v (race %t)", name, calls, cmds, byName, lat[calls/2], lat[calls*99/100], lat[calls-1], raceEnabled())
		if cmds > calls/20 {
			t.Errorf("%s: %d Redis commands for %d calls, want at most %d", name, cmds, calls, calls/20)
		}
		if got := e.up.TotalCalls() - upBefore; got != 0 {
			t.Errorf("%s: upstream saw %d calls", name, got)
		}
	}
	denied := newAgent(t, failures, "loop", "denied", true)
	mustPass(t, denied.call(0, "search", map[string]any{"query": "first"}), "the one admitted search")
	loop("denied key", failures, denied, "search", calls, "subject")

	stuck := newAgent(t, failures, "loop", "stuck", true)
	mustPass(t, stuck.call(0, "fail", failArgs), "failure 1")
	mustPass(t, stuck.call(1, "fail", failArgs), "failure 2")
	loop("open breaker", failures, stuck, "echo", 0, "")

	looping := newAgent(t, denials, "loop", "looping", true)
	mustPass(t, looping.call(0, "search", map[string]any{"query": "first"}), "the one admitted search")
	loop("denied until open", denials, looping, "search", 5, "subject")
}
