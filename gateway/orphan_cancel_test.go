package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// Without a session every client of a subject shares one id space, and
// fresh clients number their requests from the same small ids. Client A's
// cached call 1 is orphaned (A hung up, its load runs on, registered so
// that its cancellation never reaches the flight); client B's call 1 is
// then cancelled: the live call wins over the orphan, B's call ends at
// once (the two matched together, so neither was cancelled).
func TestOrphanedCallDoesNotBlockAnotherClientsCancellation(t *testing.T) {
	e := newEnv(t, setup{Upstream: stateless, Config: "tools:\n  slow:\n    cache: {ttl: 10m, shared: true}\n"})
	tok := token(t, "acme", "alice")
	actx, hangUp := context.WithCancel(context.Background())
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		_, _ = postCtx(actx, e.mcpURL(0), tok, callBody(1, "slow", map[string]any{"ms": 3000}), nil)
	}()
	eventually(t, 10*time.Second, "A's load to reach the upstream", func() bool { return e.up.Calls("slow") == 1 })
	hangUp()
	<-aDone
	time.Sleep(200 * time.Millisecond) // A's request has ended; its load runs on

	bDone := make(chan *response, 1)
	start := time.Now()
	go func() {
		r, err := postCtx(context.Background(), e.mcpURL(0), tok, callBody(1, "slow", map[string]any{"ms": 2000}), nil)
		if err != nil {
			t.Error(err)
		}
		bDone <- r
	}()
	eventually(t, 10*time.Second, "B's load to reach the upstream", func() bool { return e.up.Calls("slow") == 2 })
	c := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"x"}}`, nil)
	r := <-bDone
	t.Logf("cancellation answered %d; B got %d after %v: %s", c.Status, r.Status, time.Since(start).Round(time.Millisecond), r.Body)
	if r.Status != http.StatusAccepted {
		t.Fatalf("B's cancelled call answered %d after %v, want 202 at once: its cancellation matched A's orphaned call too", r.Status, time.Since(start).Round(time.Millisecond))
	}
}
