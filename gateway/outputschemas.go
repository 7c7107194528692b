package gateway

import (
	"encoding/json"
	"maps"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// toolSchemas is enforce.OutputSchemas fed with the tools/list answers the
// gateway relays, as the callers got them (trimmed to their scopes). With
// upstreams: the names are the exposed ones, which name the upstream too,
// as in a tools/call. Each runtime has one, which a reload keeps when the
// upstream stays the same (sameUpstream): the clients that listed the
// tools before it still validate against what they were told. A nil
// *toolSchemas knows nothing and learns nothing.
type toolSchemas struct{ enforce.OutputSchemas }

// onToolsList learns from the answer to a tools/list: it is the request's
// mcp.Forward.OnResult. An error, or a result that is not a list of
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
// upstream (URL and headers), whose tools are then the same. With
// upstreams: both reach the federation, whose upstreams only a restart
// changes.
func sameUpstream(a, b *policy.Config) bool {
	return a.Upstream.URL == b.Upstream.URL && maps.Equal(a.Upstream.Headers, b.Upstream.Headers)
}
