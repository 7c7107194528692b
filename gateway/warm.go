package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// warmTimeout bounds the warm-up at startup: past it the gateway reports
// ready with whatever was warmed (a slow upstream must not keep it down).
const warmTimeout = time.Minute

// warmProtocol is the MCP version of warm-up sessions. A warmed value is
// served to callers of every version, and under 2026-07-28 a server adds
// members of that version to results (resultType, _meta serverInfo): warm
// up with the last version whose results every client reads alike (a
// 2026-07-28 client takes a result without resultType as complete).
const warmProtocol = "2025-11-25"

// headerTransport adds fixed headers to every request.
type headerTransport struct {
	base   http.RoundTripper
	header http.Header
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.header {
		r.Header[k] = v
	}
	return t.base.RoundTrip(r)
}

// warm fills the cache with cfg.Cache.Warm before the gateway reports
// ready. Each entry is fetched from the upstream with the official MCP
// client, as its tenant (identity headers) or as nobody for shared tools;
// all entries go to the cache in one batch (pipelined by the cache).
func (g *Gateway) warm(ctx context.Context, cfg *policy.Config) {
	defer g.ready.Store(true)
	if len(cfg.Cache.Warm) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	sessions := newWarmSessions(cfg, g.fed.transport())
	defer sessions.close()
	items := make([]cache.WarmItem, 0, len(cfg.Cache.Warm))
	for _, w := range cfg.Cache.Warm {
		tc := cfg.Tools[w.Tool].Cache
		if tc == nil {
			continue // policy refuses this; keep the guard
		}
		args, err := json.Marshal(w.Args)
		if err != nil {
			g.log.Warn("cache.warm: arguments", "tool", w.Tool, "err", err)
			continue
		}
		scope, tenant := cache.Tenant(w.Tenant), w.Tenant
		if tc.Shared {
			scope, tenant = cache.Shared(), ""
		}
		key, err := cache.NewKey(scope, w.Tool, args)
		if err != nil {
			g.log.Warn("cache.warm: key", "tool", w.Tool, "err", err)
			continue
		}
		tags, _ := cache.RenderTags(tc.Tags, args)
		tool, arguments := w.Tool, w.Args
		items = append(items, cache.WarmItem{
			Key:    key,
			Policy: cache.Policy{TTL: tc.TTL, Jitter: tc.Jitter, NegativeTTL: tc.NegativeTTL, Tags: tags},
			Load: func(ctx context.Context) ([]byte, bool, error) {
				cs, err := sessions.get(ctx, tenant)
				if err != nil {
					return nil, false, err
				}
				res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: arguments})
				if err != nil {
					return nil, false, err
				}
				b, err := json.Marshal(res)
				return b, res.IsError, err
			},
		})
	}
	res, err := g.eng.Cache().Warm(ctx, items)
	if err != nil {
		g.log.Warn("cache warm-up incomplete", "err", err)
	}
	g.log.Info("cache warmed", "items", len(items), "loaded", res.Loaded, "fresh", res.Fresh, "busy", res.Busy, "failed", res.Failed)
}

// warmSessions holds one upstream MCP session per tenant during warm-up.
type warmSessions struct {
	cfg *policy.Config
	rt  http.RoundTripper // nil: http.DefaultTransport
	mu  sync.Mutex
	m   map[string]*sdk.ClientSession
}

func newWarmSessions(cfg *policy.Config, rt http.RoundTripper) *warmSessions {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &warmSessions{cfg: cfg, rt: rt, m: make(map[string]*sdk.ClientSession)}
}

func (s *warmSessions) get(ctx context.Context, tenant string) (*sdk.ClientSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cs, ok := s.m[tenant]; ok {
		return cs, nil
	}
	h := make(http.Header)
	for k, v := range s.cfg.Upstream.Headers {
		h.Set(k, v)
	}
	if s.cfg.Upstream.IdentityHeaders && tenant != "" {
		h.Set(mcp.HeaderTenant, headerSafe(tenant))
	}
	client := sdk.NewClient(&sdk.Implementation{Name: "mcpgate-warmup", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint:             s.cfg.Upstream.URL,
		HTTPClient:           &http.Client{Transport: headerTransport{base: s.rt, header: h}},
		MaxRetries:           -1,
		DisableStandaloneSSE: true,
	}, &sdk.ClientSessionOptions{ProtocolVersion: warmProtocol})
	if err != nil {
		return nil, fmt.Errorf("connect to the upstream: %w", err)
	}
	s.m[tenant] = cs
	return cs, nil
}

func (s *warmSessions) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cs := range s.m {
		_ = cs.Close()
	}
}
