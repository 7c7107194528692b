package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

const rootsChanged = `{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`

// oneNotification allows a tenant one notification: the
// notifications/initialized of its first session spends it.
const oneNotification = `
tiers:
  free:
    limits:
      - {name: notes, methods: [notifications], algorithm: fixed_window, limit: 1, period: 1h}
`

// A client's notifications reach the upstream, so a tenant could flood it
// for free: a rule naming "notifications" counts them. Of 120 concurrent
// notifications under a limit of L, exactly L reach the upstream and the
// rest get 429 with the rule's denial and no id; on one instance in memory
// and on two instances sharing Redis.
func TestNotificationsCountedExactly(t *testing.T) {
	t.Parallel()
	const L, total = 23, 120
	for _, mode := range storeModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, mode.redis, mode.instances, fmt.Sprintf(`
tiers:
  free:
    limits:
      - {name: notes, methods: [notifications], algorithm: fixed_window, limit: %d, period: 1h}
`, L), upstream.Options{})
			tok := token(t, "acme", "alice")
			hdr := openRawSession(t, e, tok) // its notifications/initialized is the first counted
			var accepted, denied, other atomic.Int64
			accepted.Add(1)
			run(8, total-1, func(i int) {
				r, err := postCtx(context.Background(), e.mcpURL(i), tok, rootsChanged, hdr)
				switch {
				case err != nil:
					other.Add(1)
				case r.Status == http.StatusTooManyRequests:
					if d := r.denial(t); d.Rule != "notes" || d.Scope != "tenant" || string(r.Msg.ID) != "null" {
						t.Errorf("denial %+v, id %s: want rule notes per tenant, id null", d, r.Msg.ID)
					}
					denied.Add(1)
				case r.Status == http.StatusAccepted:
					accepted.Add(1)
				default:
					t.Errorf("notification answered %d %s", r.Status, r.Body)
					other.Add(1)
				}
			})
			reached := waitNotified(t, e, accepted.Load())
			if reached != L || accepted.Load() != L || denied.Load() != total-L || other.Load() != 0 {
				t.Fatalf("upstream saw %d notifications, gateway accepted %d, denied %d, other %d; want %d reached, %d denied",
					reached, accepted.Load(), denied.Load(), other.Load(), L, total-L)
			}
			// Another tenant has its own counter.
			bob := token(t, "other", "bob")
			if r := post(t, e.mcpURL(0), bob, rootsChanged, openRawSession(t, e, bob)); r.Status != http.StatusAccepted {
				t.Fatalf("another tenant's notification: %d %s", r.Status, r.Body)
			}
		})
	}
}

// Without a rule naming them, notifications count under their own
// built-in rule (default_notifications: burst 120): a flood is cut there,
// while the tenant's requests keep their own budget.
func TestNotificationsUnderTheDefaultRule(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{})
	tok := token(t, "acme", "alice")
	hdr := openRawSession(t, e, tok)
	accepted := 1 // notifications/initialized
	for i := range 300 {
		r := post(t, e.mcpURL(0), tok, rootsChanged, hdr)
		if r.Status == http.StatusAccepted {
			accepted++
			continue
		}
		if r.Status != http.StatusTooManyRequests {
			t.Fatalf("notification %d: %d %s", i, r.Status, r.Body)
		}
		if d := r.denial(t); d.Rule != "default_notifications" {
			t.Fatalf("denial %+v, want default_notifications", d)
		}
		break
	}
	if r := post(t, e.mcpURL(0), tok, methodBody(9, "ping", `{}`), hdr); r.Status != http.StatusOK {
		t.Fatalf("a ping once the notifications' budget is spent: %d %s", r.Status, r.Body)
	}
	// 120 of burst, and the refill (10 a second) while they were sent.
	if accepted < 120 || accepted >= 300 {
		t.Fatalf("%d notifications accepted before the first 429, want the burst of 120 and not all 300", accepted)
	}
	if got := waitNotified(t, e, int64(accepted)); got != int64(accepted) {
		t.Fatalf("upstream saw %d notifications, want the %d accepted", got, accepted)
	}
}

// A cancellation of one of the caller's calls in progress stops work, so it
// is never refused, even with the notification budget spent; any other
// notification, a cancellation naming no call of the caller's, and a
// response to nothing are refused then.
func TestCancellationOfALiveCallIsNeverRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: oneNotification})
	tok := token(t, "acme", "alice")
	hdr := openRawSession(t, e, tok) // its notifications/initialized spends the budget (1)
	if r := post(t, e.mcpURL(0), tok, rootsChanged, hdr); r.Status != http.StatusTooManyRequests {
		t.Fatalf("a notification past the limit: %d %s, want 429", r.Status, r.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := callInFlight(ctx, t, e, tok, callBody(7, "slow", map[string]any{"ms": 30000}), hdr, "slow", 1)
	if r := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`, hdr); r.Status != http.StatusAccepted {
		t.Fatalf("cancelling a call in progress with the budget spent: %d %s, want 202", r.Status, r.Body)
	}
	eventually(t, 10*time.Second, "the cancellation to reach the upstream", func() bool {
		return e.up.Requests("notifications/cancelled") == 1 && e.up.Cancelled() == 1
	})
	<-done
	for name, body := range map[string]string{
		"a cancellation of no call": `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}`,
		"a response to nothing":     `{"jsonrpc":"2.0","id":"s1","result":{}}`,
	} {
		if r := post(t, e.mcpURL(0), tok, body, hdr); r.Status != http.StatusTooManyRequests {
			t.Errorf("%s past the limit: %d %s, want 429", name, r.Status, r.Body)
		}
	}
	if got := e.up.Requests("notifications/cancelled"); got != 1 {
		t.Errorf("upstream saw %d cancellations, want only the live call's", got)
	}
}

// openRawSession opens a session through instance 0 with a raw initialize
// and notifications/initialized, and returns the headers of its requests.
func openRawSession(t *testing.T, e *env, tok string) http.Header {
	t.Helper()
	r := initialize(t, e, 0, tok)
	sid := r.Header.Get("Mcp-Session-Id")
	if r.Status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	hdr := http.Header{"Mcp-Session-Id": {sid}}
	if r := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr); r.Status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s", r.Status, r.Body)
	}
	return hdr
}

// waitNotified returns how many notifications/initialized and
// roots/list_changed reached the upstream once it has handled at least
// accepted of them (the go-sdk server answers a notification with 202
// before its handler runs).
func waitNotified(t *testing.T, e *env, accepted int64) int64 {
	t.Helper()
	n := func() int64 {
		return e.up.Requests("notifications/initialized") + e.up.Requests("notifications/roots/list_changed")
	}
	eventually(t, 10*time.Second, "the upstream to handle the accepted notifications", func() bool { return n() >= accepted })
	return n()
}

// Only a call's first cancellation passes uncounted: 40 concurrent
// cancellations of one call in progress, with the notifications' budget
// spent, put exactly one on the upstream; the others are refused.
func TestRepeatedCancellationIsCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: oneNotification})
	tok := token(t, "acme", "alice")
	hdr := openRawSession(t, e, tok) // spends the budget
	done := callInFlight(t.Context(), t, e, tok, callBody(7, "slow", map[string]any{"ms": 30000}), hdr, "slow", 1)
	const cancel7 = `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`
	var accepted, refused atomic.Int64
	run(8, 40, func(int) {
		switch r := post(t, e.mcpURL(0), tok, cancel7, hdr); r.Status {
		case http.StatusAccepted:
			accepted.Add(1)
		case http.StatusTooManyRequests:
			refused.Add(1)
		default:
			t.Errorf("a cancellation of call 7: %d %s", r.Status, r.Body)
		}
	})
	<-done
	if accepted.Load() != 1 || refused.Load() != 39 {
		t.Errorf("%d cancellations accepted, %d refused; want 1 and 39", accepted.Load(), refused.Load())
	}
	eventually(t, 10*time.Second, "the cancellation to reach the upstream", func() bool { return e.up.Requests("notifications/cancelled") >= 1 })
	if got := e.up.Requests("notifications/cancelled"); got != 1 {
		t.Errorf("upstream saw %d cancellations, want 1", got)
	}
}

// A call without a session cannot be cancelled
// upstream: its cancellation is answered by the gateway at once and never
// forwarded, however often it comes (a repeat counts, as any
// notification), and the cancelled call's own POST gets 202 with no body
// once the upstream has answered (not the upstream's 200 with a body it no
// longer has).
func TestSessionlessCancellationStaysHere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: oneNotification, Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	tok := token(t, "acme", "alice")
	got := callInFlight(t.Context(), t, e, tok, callBody(7, "slow", map[string]any{"ms": 3000}), nil, "slow", 1)
	const cancel7 = `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`
	// The first is not counted, the first repeat spends the budget (1).
	for i, want := range []int{http.StatusAccepted, http.StatusAccepted, http.StatusTooManyRequests, http.StatusTooManyRequests} {
		if r := post(t, e.mcpURL(0), tok, cancel7, nil); r.Status != want {
			t.Fatalf("cancellation %d of call 7: %d %s, want %d", i, r.Status, r.Body, want)
		}
	}
	a := <-got
	if a.err != nil || a.r.Status != http.StatusAccepted || len(a.r.Body) != 0 {
		t.Fatalf("the cancelled call's own answer: %v, %+v; want 202 with no body", a.err, a.r)
	}
	if n := e.up.Requests("notifications/cancelled"); n != 0 {
		t.Errorf("upstream saw %d cancellations, want none", n)
	}
	m := scrape(t, e.base[0])
	if v := m[`mcpgate_requests_total{method="tools/call",outcome="cancelled"}`]; v != 1 {
		t.Errorf("tools/call counted cancelled %v times, want 1 (metrics %v)", v, m)
	}
}
