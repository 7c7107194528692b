package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// The cost detach adds to a session-less call
// whose client stays: contexts, the writer wrapper, the header snapshot.
func BenchmarkDetach(b *testing.B) {
	g := &Gateway{}
	ctx, cancel := context.WithCancel(context.Background()) // as a server's request has
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/mcp", nil)
	w := httptest.NewRecorder()
	setRateHeaders(w.Header(), limit.Decision{Allowed: true, Rule: limit.Rule{Name: "per_tenant", Limit: 100, Period: time.Minute}, Limit: 100, Remaining: 50, ResetAfter: time.Second}, time.Now())
	b.ReportAllocs()
	for b.Loop() {
		gw, _ := g.detach(w, r, time.Minute)
		gw.end()
	}
}
