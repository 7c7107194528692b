package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// toolCaching is what a runtime knows about caching one tool.
type toolCaching struct {
	policy      *policy.ToolCache // nil: results not cached
	tags        *cache.Tags       // tag templates of cached entries
	invalidates *cache.Tags       // tags dropped after a successful call
}

// compileCaching compiles the cache settings of every tool of cfg.
func compileCaching(cfg *policy.Config) (map[string]toolCaching, bool, error) {
	out := make(map[string]toolCaching)
	sharedTags := false
	for name, t := range cfg.Tools {
		var tc toolCaching
		var err error
		if t.Cache != nil {
			tc.policy = t.Cache
			if tc.tags, err = cache.CompileTags(t.Cache.Tags); err != nil {
				return nil, false, fmt.Errorf("tools.%s.cache.tags: %w", name, err)
			}
			sharedTags = sharedTags || (t.Cache.Shared && len(t.Cache.Tags) > 0)
		}
		if len(t.Invalidates) > 0 {
			if tc.invalidates, err = cache.CompileTags(t.Invalidates); err != nil {
				return nil, false, fmt.Errorf("tools.%s.invalidates: %w", name, err)
			}
		}
		if tc.policy != nil || tc.invalidates != nil {
			out[name] = tc
		}
	}
	return out, sharedTags, nil
}

// captureWriter records an upstream answer relayed by the proxy, for a
// cache loader (the answer goes to several callers, each with its own id).
type captureWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *captureWriter) Header() http.Header { return c.header }
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(b)
}
func (c *captureWriter) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}
func (c *captureWriter) Flush() {}

// uncacheable is a loader's answer that is not a result: a JSON-RPC error
// object, or an HTTP failure. It reaches every caller of the flight and is
// never stored.
type uncacheable struct {
	status int
	rpcErr json.RawMessage
}

func (u *uncacheable) Error() string {
	if u.rpcErr != nil {
		return "upstream answered a JSON-RPC error"
	}
	return fmt.Sprintf("upstream answered HTTP %d", u.status)
}

// cachedCall answers a tools/call of a cacheable tool from the cache, the
// upstream being called at most once for all concurrent callers of the
// same key. It reports whether the answer was an error result (for the
// breaker) and the result this caller's own load produced (for a cost
// correction; nil on a hit).
func (g *Gateway) cachedCall(w http.ResponseWriter, r *http.Request, rt *runtime, fwd mcp.Forward, p auth.Principal, tc toolCaching) (failed bool, loaded json.RawMessage, status int) {
	msg := fwd.Msg
	scope := cache.Tenant(p.Tenant)
	if tc.policy.Shared {
		scope = cache.Shared()
	}
	key, err := cache.NewKey(scope, msg.ToolName, msg.Arguments)
	if err != nil {
		g.metrics.CacheRequests.WithLabelValues("bypass").Inc()
		return false, nil, g.forward(w, r, rt, fwd, "tools/call")
	}
	tags, err := tc.tags.Render(msg.Arguments)
	if err != nil {
		tags = nil // the entry is still cached, just not tagged
		g.log.Warn("cache tags cannot be rendered", "tool", msg.ToolName, "err", err)
	}
	pol := cache.Policy{TTL: tc.policy.TTL, Jitter: tc.policy.Jitter, NegativeTTL: tc.policy.NegativeTTL, Tags: tags}
	var mine json.RawMessage
	entry, src, err := g.cache.Get(r.Context(), key, func(ctx context.Context) ([]byte, bool, error) {
		cw := &captureWriter{header: make(http.Header)}
		var result, rpcErr json.RawMessage
		f := fwd
		f.OnResult = func(res, e json.RawMessage) { result, rpcErr = res, e }
		st, err := rt.proxy.Serve(cw, r.Clone(ctx), f)
		switch {
		case result != nil:
			mine = result
			return result, isErrorResult(result), nil
		case rpcErr != nil:
			return nil, false, &uncacheable{status: http.StatusOK, rpcErr: rpcErr}
		case err != nil && st == 0:
			return nil, false, &uncacheable{status: http.StatusBadGateway}
		default:
			return nil, false, &uncacheable{status: max(st, http.StatusBadGateway)}
		}
	}, pol)
	if err != nil {
		var u *uncacheable
		switch {
		case errors.As(err, &u) && u.rpcErr != nil:
			writeRPC(w, http.StatusOK, msg.ID, "error", u.rpcErr)
			return true, nil, http.StatusOK
		case errors.As(err, &u):
			mcp.WriteError(w, u.status, msg.ID, mcp.CodeInternalError, "upstream unavailable", nil)
			return true, nil, u.status
		case r.Context().Err() != nil:
			return false, nil, 0 // the caller went away
		default:
			mcp.WriteError(w, http.StatusBadGateway, msg.ID, mcp.CodeInternalError, "upstream unavailable: "+err.Error(), nil)
			return true, nil, http.StatusBadGateway
		}
	}
	g.metrics.CacheRequests.WithLabelValues(src.String()).Inc()
	w.Header().Set("X-Mcp-Cache", src.String())
	writeRPC(w, http.StatusOK, msg.ID, "result", entry.Value)
	if src != cache.Miss {
		mine = nil
	}
	return entry.Negative, mine, http.StatusOK
}

// writeRPC writes a JSON-RPC response with the caller's id around a result
// or an error object.
func writeRPC(w http.ResponseWriter, status int, id json.RawMessage, member string, value json.RawMessage) {
	if id == nil {
		id = json.RawMessage("null")
	}
	var b bytes.Buffer
	b.Grow(len(value) + len(id) + 40)
	b.WriteString(`{"jsonrpc":"2.0","id":`)
	b.Write(id)
	b.WriteString(`,"` + member + `":`)
	b.Write(value)
	b.WriteByte('}')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// invalidateAfter drops the cache entries a successful call of a mutating
// tool made stale.
func (g *Gateway) invalidateAfter(ctx context.Context, rt *runtime, tenant string, tc toolCaching, args json.RawMessage) {
	tags, err := tc.invalidates.Render(args)
	if err != nil || len(tags) == 0 {
		return
	}
	if _, err := g.invalidate(ctx, rt, tenant, tags); err != nil {
		g.log.Warn("cache invalidation failed", "tenant", tenant, "tags", tags, "err", err)
	}
}

// invalidate drops the tenant's entries with tags, and the shared entries
// with them when any shared tool is tagged.
func (g *Gateway) invalidate(ctx context.Context, rt *runtime, tenant string, tags []string) (int, error) {
	n, err := g.cache.Invalidate(ctx, cache.Tenant(tenant), tags)
	if err != nil || !rt.sharedTags {
		return n, err
	}
	m, err := g.cache.Invalidate(ctx, cache.Shared(), tags)
	return n + m, err
}
