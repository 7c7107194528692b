package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/mcp"
)

// An upstream's rate-limit denial of one tenant's call is that tenant's:
// the other tenants whose calls of a shared tool joined its cache flight
// make their own calls, as they do for the result form
// (failedFlightAnswer). The denial comes as an HTTP 429 (the JSON-RPC
// error form), or as a JSON-RPC error with mcpgate's code -33029 in an
// HTTP 200 (a server built with the gosdk middleware, which has no HTTP
// status of its own to set).
func TestUpstreamDenialStatusIsNotServedToFlightFollowers(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		code       int
	}{
		{"429", http.StatusTooManyRequests, "30", -32029},
		{"200 with -33029", http.StatusOK, "", mcp.CodeRateLimited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var denied atomic.Bool
			var inner atomic.Pointer[http.Handler]
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				method, id := peekRPC(r)
				if method == "tools/call" && denied.CompareAndSwap(false, true) {
					time.Sleep(500 * time.Millisecond) // the others join this flight
					if tc.retryAfter != "" {
						w.Header().Set("Retry-After", tc.retryAfter)
					}
					writeRPC(w, tc.status, id, "error",
						json.RawMessage(fmt.Sprintf(`{"code":%d,"message":"rate limit exceeded for tenant acme; retry in 30s"}`, tc.code)))
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
		})
	}
}
