package gateway

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// Rules whose numbers cannot move during a test: an exact log of an hour,
// a GCRA refilling one unit every six minutes, and slots of ended calls.
const liveLimitsConfig = `
default_tier: free
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: sliding_window, limit: 5, period: 1h}
      - {name: per_user, per: subject, algorithm: sliding_window, limit: 4, period: 1h}
      - {name: per_tool, per: tenant_tool, algorithm: gcra, limit: 10, period: 1h}
tools:
  echo:
    limits:
      - {name: echo_in_flight, per: tenant_tool, algorithm: concurrency, limit: 2, period: 1m}
`

type liveLimits struct {
	Tenant  string     `json:"tenant"`
	Tier    string     `json:"tier"`
	Subject string     `json:"subject"`
	Live    []liveView `json:"live"`
}

func getLive(t *testing.T, url string) liveLimits {
	t.Helper()
	r := adminReq(t, http.MethodGet, url, "Bearer "+testAdmin)
	if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("GET %s: %d %s", url, r.Status, r.Body)
	}
	var l liveLimits
	if err := json.Unmarshal(r.Body, &l); err != nil {
		t.Fatalf("%s: %v", r.Body, err)
	}
	return l
}

// remaining maps "rule/tool" to the remaining of each live counter.
func (l liveLimits) remaining() map[string]int64 {
	out := map[string]int64{}
	for _, v := range l.Live {
		out[v.Rule+"/"+v.Tool] = v.Remaining
	}
	return out
}

func postReset(t *testing.T, base, authorization, body string) *response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/admin/limits/reset", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// After N calls GET /admin/limits shows remaining L-N for each of the
// tenant's counters, reading it twice changes nothing (nor does it charge
// the calls after it), subject counters show with &subject= only, and
// POST /admin/limits/reset restores L: the tenant's counters first, then
// the subject's when named. On the memory store and on Redis shared by two
// gateways (the view and the reset on one, calls on both).
func TestAdminLiveLimitsAndReset(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, liveLimitsConfig, upstream.Options{})
			base := e.base[0]
			tok := token(t, "acme", "alice")
			const n = 3
			for i := range n {
				if r := e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
					t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
				}
			}
			url := base + "/admin/limits?tenant=acme"
			first := getLive(t, url)
			// Only tools listed in the config get per-tool counters; the
			// built-in rules of the other methods are listed too (calls made
			// no initialize: their buckets are full).
			want := map[string]int64{"per_tenant/": 5 - n, "per_tool/echo": 10 - n, "echo_in_flight/echo": 2,
				"default_initialize/": 10, "default_requests/": 120, "default_notifications/": 120}
			if first.Tier != "free" || !maps.Equal(first.remaining(), want) {
				t.Fatalf("live %+v\nwant %v", first, want)
			}
			for _, v := range first.Live {
				if v.Rule == "per_tenant" && (v.Limit != 5 || v.ResetAfterMS <= 0 || v.ResetAfterMS > time.Hour.Milliseconds() || v.Reset < time.Now().Unix()) {
					t.Fatalf("per_tenant: %+v", v)
				}
				if v.Rule == "echo_in_flight" && v.ResetAfterMS != 0 {
					t.Fatalf("no slot held, yet reset after %dms", v.ResetAfterMS)
				}
			}
			if again := getLive(t, url); !maps.Equal(again.remaining(), want) {
				t.Fatalf("second read %v, want %v", again.remaining(), want)
			}
			// The reads charged nothing: one more call leaves L-N-1.
			if r := e.callRaw(0, tok, "next", "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
				t.Fatalf("call after the reads: %d %s", r.Status, r.Body)
			}
			user := getLive(t, url+"&subject=alice")
			if got := user.remaining()["per_tenant/"]; got != 5-n-1 {
				t.Fatalf("per_tenant remaining %d after one more call, want %d", got, 5-n-1)
			}
			if got := user.remaining()["per_user/"]; user.Subject != "alice" || got != 4-n-1 {
				t.Fatalf("subject view %+v: per_user remaining %d, want %d", user, got, 4-n-1)
			}

			if r := postReset(t, base, "", `{"tenant":"acme"}`); r.Status != http.StatusUnauthorized {
				t.Fatalf("reset without the admin token: %d", r.Status)
			}
			for _, bad := range []string{`{}`, `{"tenant":"acme","x":1}`, `not json`} {
				if r := postReset(t, base, "Bearer "+testAdmin, bad); r.Status != http.StatusBadRequest {
					t.Fatalf("reset %s: %d %s", bad, r.Status, r.Body)
				}
			}
			if r := postReset(t, base, "Bearer "+testAdmin, `{"tenant":"acme"}`); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"cleared":2`) {
				t.Fatalf("reset: %d %s", r.Status, r.Body)
			}
			after := getLive(t, url+"&subject=alice").remaining()
			if after["per_tenant/"] != 5 || after["per_tool/echo"] != 10 || after["per_user/"] != 4-n-1 {
				t.Fatalf("after the tenant reset: %v", after)
			}
			if r := postReset(t, base, "Bearer "+testAdmin, `{"tenant":"acme","subject":"alice"}`); r.Status != http.StatusOK {
				t.Fatalf("subject reset: %d %s", r.Status, r.Body)
			}
			if got := getLive(t, url+"&subject=alice").remaining()["per_user/"]; got != 4 {
				t.Fatalf("after the subject reset per_user remaining %d, want 4", got)
			}
			// Calls are admitted again up to the limit, on every instance.
			for i := range 4 {
				if r := e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
					t.Fatalf("call %d after reset: %d %s", i, r.Status, r.Body)
				}
			}
		})
	}
}

// A reset made on one instance reaches the others, whose denial caches
// still hold the counter's denial with a retry time an hour away: within
// enforce.DenialCacheHold they ask Redis again and admit. Exactly one call
// is admitted after the reset (limit 1), whichever instance makes it.
func TestAdminResetReachesEveryInstance(t *testing.T) {
	t.Parallel()
	e := newLimitEnv(t, true, 2, `
tools:
  echo:
    limits:
      - {name: echo_hourly, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1h}
`, upstream.Options{Stateless: true, JSONResponse: true})
	tok := token(t, "acme", "alice")
	args := map[string]any{"text": "x"}
	if r := e.callRaw(0, tok, 1, "echo", args); r.Status != http.StatusOK {
		t.Fatalf("first call: %d %s", r.Status, r.Body)
	}
	// Each instance gets its denial from Redis and caches it.
	for i := range 2 {
		if r := e.callRaw(i, tok, 2, "echo", args); r.Status != http.StatusTooManyRequests {
			t.Fatalf("second call on instance %d: %d %s", i, r.Status, r.Body)
		}
	}
	if r := postReset(t, e.base[0], "Bearer "+testAdmin, `{"tenant":"acme"}`); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"cleared":1`) {
		t.Fatalf("reset on instance 0: %d %s", r.Status, r.Body)
	}
	// The deadline only keeps a broken build from waiting the hour out.
	deadline := time.Now().Add(enforce.DenialCacheHold + 20*time.Second)
	for {
		r := e.callRaw(1, tok, 3, "echo", args)
		if r.Status == http.StatusOK {
			break
		}
		if r.Status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("instance 1 after the reset on instance 0: %d %s (still denying)", r.Status, r.Body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range 2 {
		if r := e.callRaw(i, tok, 4, "echo", args); r.Status != http.StatusTooManyRequests {
			t.Fatalf("instance %d after the one admission the reset allows: %d %s", i, r.Status, r.Body)
		}
	}
}

// Per-tool counters of tools the config does not list (a tier rule per
// tenant_tool or subject_tool counts every tool called) are shown by GET
// /admin/limits and cleared by a tenant's reset: the store is asked which
// it holds. On the memory store and on Redis shared by two gateways.
func TestAdminLimitsUnlistedTools(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, `
default_tier: free
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 2, period: 1h}
      - {name: per_user_tool, per: subject_tool, algorithm: fixed_window, limit: 5, period: 1h}
`, upstream.Options{Stateless: true, JSONResponse: true})
			tok := token(t, "acme", "alice")
			calls := []struct {
				instance int
				tool     string
				args     map[string]any
				status   int
			}{
				{0, "echo", map[string]any{"text": "x"}, http.StatusOK},
				{m.instances - 1, "echo", map[string]any{"text": "x"}, http.StatusOK},
				{m.instances - 1, "search", map[string]any{"query": "q"}, http.StatusOK},
				{0, "echo", map[string]any{"text": "x"}, http.StatusTooManyRequests},
			}
			for i, c := range calls {
				if r := e.callRaw(c.instance, tok, i, c.tool, c.args); r.Status != c.status {
					t.Fatalf("call %d (%s): %d %s, want %d", i, c.tool, r.Status, r.Body, c.status)
				}
			}
			url := e.base[0] + "/admin/limits?tenant=acme"
			want := map[string]int64{"per_tool/echo": 0, "per_tool/search": 1, "per_user_tool/echo": 3, "per_user_tool/search": 4}
			live := getLive(t, url+"&subject=alice").remaining()
			for k, v := range want {
				if got, ok := live[k]; !ok || got != v {
					t.Fatalf("live %v: %s = %d (shown %v), want %d", live, k, got, ok, v)
				}
			}
			if _, ok := getLive(t, url).remaining()["per_user_tool/echo"]; ok {
				t.Fatal("a subject's counter shown without &subject=")
			}

			if r := postReset(t, e.base[0], "Bearer "+testAdmin, `{"tenant":"acme"}`); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"cleared":2`) {
				t.Fatalf("tenant reset: %d %s, want the two per_tool counters cleared", r.Status, r.Body)
			}
			live = getLive(t, url+"&subject=alice").remaining()
			if _, ok := live["per_tool/echo"]; ok || live["per_user_tool/echo"] != 3 {
				t.Fatalf("after the tenant reset: %v, want no per_tool counter and the subject's kept", live)
			}
			for i := range 2 {
				if r := e.callRaw(0, tok, 10+i, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
					t.Fatalf("echo %d after the reset: %d %s", i, r.Status, r.Body)
				}
			}
			if r := postReset(t, e.base[0], "Bearer "+testAdmin, `{"tenant":"acme","subject":"alice"}`); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"cleared":2`) {
				t.Fatalf("subject reset: %d %s, want the two per_user_tool counters cleared", r.Status, r.Body)
			}
			after := map[string]int64{"per_tool/echo": 0, "default_initialize/": 10, "default_requests/": 120, "default_notifications/": 120}
			if live := getLive(t, url+"&subject=alice").remaining(); !maps.Equal(live, after) {
				t.Fatalf("after the subject reset: %v, want %v", live, after)
			}
		})
	}
}
