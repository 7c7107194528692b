package federate_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpgate/mcpgate/federate"
	gwmcp "github.com/mcpgate/mcpgate/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// tenantTransport sets the caller's identity on every request, as the
// gateway does with upstream.identity_headers.
type tenantTransport struct{ tenant string }

func (t tenantTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(gwmcp.HeaderTenant, t.tenant)
	return http.DefaultTransport.RoundTrip(r)
}

// connectAs opens a session to url whose requests carry the tenant.
func connectAs(t *testing.T, url, tenant string) *mcp.ClientSession {
	t.Helper()
	cs, err := newClient(tenant, nil).Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: tenantTransport{tenant}}}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// An upstream limiting each tenant on its own answers tenant a 429: a's
// calls are refused until its Retry-After without reaching the upstream,
// while tenant b's go through: one tenant exhausting its quota upstream
// does not lock the others out.
func TestRetryAfterIsPerCaller(t *testing.T) {
	var reachedA atomic.Int64
	a := startHTTPUpstream(t, "a", func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.Header.Get(gwmcp.HeaderTenant) == "a" {
				reachedA.Add(1)
				w.Header().Set("Retry-After", "60")
				http.Error(w, "tenant a: slow down", http.StatusTooManyRequests)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	f, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}}})
	ta, tb := connectAs(t, url, "a"), connectAs(t, url, "b")

	got, isErr := callText(t, ta, "a__echo", map[string]any{"text": "x"})
	if !isErr || !strings.Contains(got, "429") || !strings.Contains(got, "retry in 60s") {
		t.Fatalf("tenant a's call answered 429 = %q (isError %v)", got, isErr)
	}
	n := reachedA.Load()
	got, isErr = callText(t, ta, "a__echo", map[string]any{"text": "x"})
	if !isErr || !strings.Contains(got, "429 Too Many Requests") || !strings.Contains(got, "retry in") {
		t.Fatalf("tenant a's call within Retry-After = %q (isError %v)", got, isErr)
	}
	if reachedA.Load() != n {
		t.Errorf("tenant a's call within Retry-After reached the upstream")
	}
	if got, isErr := callText(t, tb, "a__echo", map[string]any{"text": "y"}); got != "a: y" || isErr {
		t.Fatalf("tenant b's call while a is limited = %q (isError %v), want it served", got, isErr)
	}
	if h := f.Health()[0]; h.State != federate.StateUp {
		t.Errorf("health while one tenant is limited = %+v, want up", h)
	}
}
