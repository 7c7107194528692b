package gateway

import (
	"context"
	"encoding/json"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// toolSchemas is enforce.OutputSchemas fed with the tools/list answers the
// gateway relays, as the callers got them (trimmed to their scopes). With
// upstreams: the names are the exposed ones, which name the upstream too,
// as in a tools/call. Each runtime whose config denies as a result has
// one, which a reload keeps when the upstream stays the same
// (sameUpstream): the clients that listed the tools before it still
// validate against what they were told. A nil *toolSchemas knows nothing
// and learns nothing.
type toolSchemas struct{ enforce.OutputSchemas }

// onToolsList learns from the answer to a tools/list: it is the request's
// relay.answered. An error, or a result that is not a list of
// tools, teaches nothing.
func (s *toolSchemas) onToolsList(result, _ json.RawMessage) {
	if s == nil || result == nil {
		return
	}
	if tools, err := mcp.ToolOutputSchemas(result); err == nil {
		s.Learn(tools)
	}
}

// declares reports whether the last tools/list answer that listed tool
// said that it declares an outputSchema.
func (s *toolSchemas) declares(tool string) bool {
	return s != nil && s.Declares(tool)
}

// sameUpstream reports whether configurations a and b reach the same
// upstream (URL), whose tools are then the same: a reload that rotates a
// credential in its headers keeps what was learnt (the start-up listing
// is not run again). With upstreams: both reach the federation, whose
// upstreams only a restart changes.
func sameUpstream(a, b *policy.Config) bool {
	return a.Upstream.URL == b.Upstream.URL
}

// discoverTimeout bounds the startup listing of the upstream's tools.
const discoverTimeout = 30 * time.Second

// deniesAsResult reports whether any tier or tool of cfg answers denials
// with a tool result: only then does an outputSchema change an answer.
func deniesAsResult(cfg *policy.Config) bool {
	for _, t := range cfg.Tiers {
		if t.DenyAs == policy.DenyResult {
			return true
		}
	}
	for _, t := range cfg.Tools {
		if t.DenyAs == policy.DenyResult {
			return true
		}
	}
	return false
}

// discoverOutputSchemas lists the upstream's tools once at start, with the
// official MCP client and no caller's identity, and learns which declare
// an outputSchema. Without it an instance knew only the lists it relayed
// itself, and behind a load balancer a client that listed its tools
// through another instance (or before a restart) was denied with the
// structuredContent its SDK rejects. An upstream that lists nothing to an
// anonymous session, or does not answer, leaves the relayed lists as the
// only source (logged).
func (g *Gateway) discoverOutputSchemas(ctx context.Context, cfg *policy.Config, into *toolSchemas) {
	ctx, cancel := context.WithTimeout(ctx, discoverTimeout)
	defer cancel()
	sessions := newWarmSessions(cfg, g.fed.transport())
	defer sessions.close()
	cs, err := sessions.get(ctx, "")
	if err == nil {
		tools := map[string]bool{}
		for tool, lerr := range cs.Tools(ctx, nil) {
			if lerr != nil {
				err = lerr
				break
			}
			tools[tool.Name] = tool.OutputSchema != nil
		}
		if err == nil {
			into.Learn(tools)
			g.log.Info("tools with an outputSchema learnt from the upstream's list", "tools", len(tools))
			return
		}
	}
	g.log.Info("the upstream's tools could not be listed at start: denials as results learn outputSchemas from the lists callers get", "err", err)
}
