package gateway

import (
	"encoding/json"
	"maps"
	"sync"

	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/policy"
)

// Bounds of toolSchemas: at most maxSchemaTools names of at most
// maxSchemaToolName bytes (MCP recommends names of 1 to 128 characters).
const (
	maxSchemaTools    = 4096
	maxSchemaToolName = 256
)

// toolSchemas is what the gateway has learnt, from the tools/list answers
// it relayed, of which tools declare an outputSchema: a result-mode denial
// of such a tool leaves its data out of structuredContent (see
// enforce.Decision.Result). Each answer replaces what is known of the
// tools it lists, and only of those: a caller sees its scopes' tools, a
// page some of them, and what others were told stays true. A tool no
// answer has listed yet counts as declaring none. With upstreams: the
// names are the exposed ones, which name the upstream too, as in a
// tools/call. Each runtime has one, which a reload keeps when the upstream
// stays the same (sameUpstream): the clients that listed the tools before
// it still validate against what they were told. It is safe for
// concurrent use; the zero value is empty, and a nil *toolSchemas knows
// nothing and learns nothing.
type toolSchemas struct {
	mu       sync.RWMutex
	declared map[string]struct{} // the tools that declare one; at most maxSchemaTools
}

// onToolsList learns from the answer to a tools/list: it is the request's
// mcp.Forward.OnResult, given the result as the caller got it (trimmed to
// its scopes). An error, or a result that is not a list of tools, teaches
// nothing.
func (s *toolSchemas) onToolsList(result, _ json.RawMessage) {
	if s == nil || result == nil {
		return
	}
	tools, err := mcp.ToolOutputSchemas(result)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, declared := range tools {
		switch {
		case !declared:
			delete(s.declared, name)
		case len(name) > maxSchemaToolName || len(s.declared) >= maxSchemaTools:
			// Not learnt: its denials keep structuredContent, as for a
			// tool never listed.
		default:
			if s.declared == nil {
				s.declared = map[string]struct{}{}
			}
			s.declared[name] = struct{}{}
		}
	}
}

// declares reports whether the last tools/list answer that listed tool
// said that it declares an outputSchema.
func (s *toolSchemas) declares(tool string) bool {
	if s == nil {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.declared[tool]
	return ok
}

// sameUpstream reports whether configurations a and b reach the same
// upstream (URL and headers), whose tools are then the same. With
// upstreams: both reach the federation, whose upstreams only a restart
// changes.
func sameUpstream(a, b *policy.Config) bool {
	return a.Upstream.URL == b.Upstream.URL && maps.Equal(a.Upstream.Headers, b.Upstream.Headers)
}
