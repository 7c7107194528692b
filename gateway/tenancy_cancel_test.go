package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A tool cached with shared: true: tenant acme's call loads the entry (its
// request, with its id 77, runs upstream in acme's session), tenant
// initech's identical call joins that flight and waits for its result.
// acme hangs up its request (the load goes on for the flight, as designed)
// and then, in its still-open session, sends notifications/cancelled for
// id 77. Call 77 stays registered while its load runs, so the notification
// is answered here and never forwarded: upstream it would cancel the
// flight's load, failing initech's call, another tenant's, and with
// negative_ttl the error would be stored and served to a third tenant
// calling later (both happened when the call left the in-flight registry
// with its request).
func TestCancellationOfALeftCallNeverReachesItsSharedFlight(t *testing.T) {
	for _, c := range []struct{ name, cache string }{
		{"the flight", "{ttl: 10m, shared: true}"},
		{"the stored entry", "{ttl: 10m, negative_ttl: 10m, shared: true}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, setup{Config: "tools:\n  slow:\n    cache: " + c.cache + "\n"})
			attacker := newAgent(t, e, "acme", "mallory", false)
			victim := newAgent(t, e, "initech", "bob", true)
			args := map[string]any{"ms": 3000}

			actx, hangUp := context.WithCancel(context.Background())
			aDone := make(chan struct{})
			go func() {
				defer close(aDone)
				_, _ = postCtx(actx, e.mcpURL(0), attacker.tok, callBody(77, "slow", args), http.Header{"Mcp-Session-Id": {attacker.sid}})
			}()
			eventually(t, 10*time.Second, "acme's load to reach the upstream", func() bool { return e.up.Calls("slow") == 1 })
			vDone := make(chan *response, 1)
			go func() {
				r, err := victim.callCtx(context.Background(), 0, "slow", args)
				if err != nil {
					t.Error(err)
				}
				vDone <- r
			}()
			time.Sleep(200 * time.Millisecond) // initech joins the flight
			hangUp()
			<-aDone
			time.Sleep(200 * time.Millisecond) // acme's request has ended (its load runs on)
			r := attacker.post(0, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":77,"reason":"x"}}`)
			t.Logf("acme's cancellation answered %d", r.Status)

			ok := func(who string, v *response) {
				t.Helper()
				t.Logf("%s got %d %s (upstream loads %d, cancelled %d)", who, v.Status, strings.TrimSpace(string(v.Body)), e.up.Calls("slow"), e.up.Cancelled())
				if v == nil || v.Status != http.StatusOK || v.Msg.Result == nil || !strings.Contains(string(v.Body), "done after 3000ms") {
					t.Fatalf("%s's call, served by a flight acme's cancellation reached", who)
				}
			}
			ok("initech", <-vDone)
			ok("globex, calling later", newAgent(t, e, "globex", "carol", true).call(0, "slow", args))
		})
	}
}
