package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// An upstream's rate-limit denial of one tenant's call as an HTTP 429 (the
// JSON-RPC error form) is that tenant's: the other tenants whose calls of a
// shared tool joined its cache flight make their own calls, as they do for
// the result form (failedFlightAnswer).
func TestUpstreamDenialStatusIsNotServedToFlightFollowers(t *testing.T) {
	var denied atomic.Bool
	var inner atomic.Pointer[http.Handler]
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		if msg.Method == "tools/call" && denied.CompareAndSwap(false, true) {
			time.Sleep(500 * time.Millisecond) // the others join this flight
			w.Header().Set("Retry-After", "30")
			writeRPC(w, http.StatusTooManyRequests, msg.ID, "error",
				json.RawMessage(`{"code":-32029,"message":"rate limit exceeded for tenant acme; retry in 30s"}`))
			return
		}
		(*inner.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	e := newEnv(t, setup{Config: "tools:\n  echo:\n    cache: {ttl: 10m, negative_ttl: 10m, shared: true}\n",
		Upstream: jsonUpstream, UpstreamURL: front.URL + "/mcp"})
	h := e.up.Handler()
	inner.Store(&h)
	args := map[string]any{"text": "hello"}
	acme := make(chan *response, 1)
	go func() { acme <- e.callRaw(0, token(t, "acme", "alice"), 1, "echo", args) }()
	time.Sleep(150 * time.Millisecond)
	var wg sync.WaitGroup
	got := make([]*response, 3)
	for i := range got {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = e.callRaw(0, token(t, "globex", "bob"), 2+i, "echo", args) }()
	}
	wg.Wait()
	<-acme
	for _, r := range got {
		if strings.Contains(string(r.Body), "tenant acme") || r.Status == http.StatusTooManyRequests {
			t.Fatalf("globex got acme's upstream rate-limit denial through the cache flight: %d %s", r.Status, r.Body)
		}
	}
}
