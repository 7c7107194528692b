package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/policy"
	mcpsetup "github.com/mcpgate/mcpgate/setup"
)

// upstream.timeout is live, but the cache's bound on one load was derived
// from it at start only: after a reload raised it from 5s to 30s, a call
// of 11.5s succeeded uncached but a cached tool's was cut at the start's
// 10s (504). The gateway is built as mcpgate serve builds it (setup.Open).
func TestReloadRaisesCachedCallBound(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		tools string
	}{
		{"uncached", ""},
		{"cached", "tools:\n  slow:\n    cache: {ttl: 1m}\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := upstream.Options{Stateless: true, JSONResponse: true}
			e := newEnv(t, setup{Upstream: up, UpstreamYAML: "  timeout: 5s\n", Config: c.tools})
			st, err := mcpsetup.Open(context.Background(), e.cfg, quietLogger(), &mcpsetup.Options{NoUsage: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			var logs syncLog
			g, err := New(t.Context(), Options{Config: e.cfg, Auth: authFor(t, e.cfg, nil), Cache: st.Cache,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)), SessionKey: DeriveSessionKey([]byte(testSecret))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Close() })
			srv := httptest.NewServer(g)
			t.Cleanup(srv.Close)

			next, err := policy.Parse("reload.yaml", []byte(e.configYAML(setup{Upstream: up, UpstreamYAML: "  timeout: 30s\n", Config: c.tools})))
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Apply(next, authFor(t, next, nil)); err != nil {
				t.Fatal(err)
			}
			r := post(t, srv.URL+"/mcp", token(t, "acme", "alice"), callBody(1, "slow", map[string]any{"ms": 11500}), nil)
			if r.Status != http.StatusOK || r.Msg.Error != nil || strings.Contains(string(r.Msg.Result), `"isError":true`) {
				t.Fatalf("a call of 11.5s after a reload set upstream.timeout to 30s: %d %s", r.Status, r.Body)
			}
			if strings.Contains(logs.String(), "restart mcpgate") {
				t.Fatalf("upstream.timeout is live, yet the reload logged a restart warning:\n%s", logs.String())
			}
		})
	}
}
