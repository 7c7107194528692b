package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// A cache flight whose caller, in a session, left while it waited for a
// lock held by another instance runs its load once that lock is freed by
// a failed load, long after the call was settled and its slot freed: it
// ran upstream outside every slot, beside the tenant's next call, so that
// a concurrency limit of one ran two. It now takes a slot of its own, and
// does not run without one.
func TestLeftFlightsLoadRunsUnderASlot(t *testing.T) {
	t.Parallel()
	var started atomic.Int64
	releaseFirst, releaseAll := make(chan struct{}), make(chan struct{})
	srv := sdk.NewServer(&sdk.Implementation{Name: "left", Version: "1"}, nil)
	sdk.AddTool(srv, &sdk.Tool{Name: "block"}, func(context.Context, *sdk.CallToolRequest, struct {
		K int `json:"k"`
	}) (*sdk.CallToolResult, any, error) {
		<-releaseAll
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "done"}}}, nil, nil
	})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if method, _ := peekRPC(r); method != "tools/call" {
			h.ServeHTTP(w, r)
			return
		}
		if started.Add(1) == 1 { // the other tenant's load: it fails, freeing its lock
			<-releaseFirst
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	redis := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{UpstreamURL: up.URL + "/mcp", Instances: 2, Redis: redis, CacheRedis: redis, Config: `
tools:
  block:
    cache: {ttl: 10m, shared: true}
    limits:
      - {name: block_one, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
`})
	t.Cleanup(sync.OnceFunc(func() { close(releaseAll) })) // before the gateways' shutdown, which waits for loads
	globex, acme := token(t, "globex", "bob"), token(t, "acme", "alice")
	key := map[string]any{"k": 1}

	// globex's load of the shared entry, on instance 0, holds its lock.
	go e.callRaw(0, globex, 1, "block", key)
	eventually(t, 10*time.Second, "globex's load to reach the upstream", func() bool { return started.Load() == 1 })
	// acme's call of it in a session, on instance 1, waits for that
	// lock; acme leaves.
	init := initialize(t, e, 1, acme)
	if init.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", init.Status, init.Body)
	}
	hdr := http.Header{"Mcp-Session-Id": {init.Header.Get("Mcp-Session-Id")}}
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan struct{})
	go func() {
		defer close(left)
		_, _ = postCtx(ctx, e.mcpURL(1), acme, callBody(2, "block", key), hdr)
	}()
	time.Sleep(300 * time.Millisecond) // its flight waits for the lock
	cancel()
	<-left
	// acme's next call, of another key, runs upstream under acme's slot.
	next := make(chan *response, 1)
	go func() {
		r, _ := postCtx(context.Background(), e.mcpURL(1), acme, callBody(3, "block", map[string]any{"k": 2}), hdr)
		next <- r
	}()
	eventually(t, 10*time.Second, "acme's next call to reach the upstream", func() bool {
		select {
		case r := <-next:
			t.Fatalf("acme's next call: %d %s", r.Status, r.Body)
		default:
		}
		return started.Load() == 2
	})
	loads := e.gws[1].eng.Cache().Stats().Loads
	close(releaseFirst) // globex's load fails: acme's flight takes the lock
	eventually(t, 10*time.Second, "acme's left flight to run its loader", func() bool {
		return e.gws[1].eng.Cache().Stats().Loads > loads
	})
	time.Sleep(300 * time.Millisecond) // what the loader started reaches the upstream
	if n := started.Load(); n != 2 {
		t.Fatalf("acme's left flight loaded upstream beside acme's next call, still running (%d calls) under a concurrency limit of 1", n)
	}
}
