package enforce

import "sync"

// Bounds of OutputSchemas: at most MaxOutputSchemaTools names of at most
// MaxOutputSchemaToolName bytes (MCP recommends names of 1 to 128 characters).
const (
	MaxOutputSchemaTools    = 4096
	MaxOutputSchemaToolName = 256
)

// OutputSchemas is what an adapter has learnt, from the tools/list answers
// it passed on, of which tools declare an outputSchema: a result-mode
// denial of such a tool carries its data in _meta only (Decision.Result),
// since a client may hold structuredContent to the tool's schema. Each
// answer replaces what is known of the tools it lists, and only of those:
// a caller sees its scopes' tools, a page some of them, and what others
// were told stays true. A tool no answer has listed counts as declaring
// none, as does one learnt past the bounds. It is safe for concurrent use;
// the zero value is empty, and a nil *OutputSchemas knows nothing and
// learns nothing.
type OutputSchemas struct {
	mu       sync.RWMutex
	declared map[string]struct{} // the tools that declare one; at most MaxOutputSchemaTools
}

// Learn records what one tools/list answer said: for each tool it listed,
// whether it declares an outputSchema.
func (s *OutputSchemas) Learn(tools map[string]bool) {
	if s == nil || len(tools) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, declared := range tools {
		switch {
		case !declared:
			delete(s.declared, name)
		case len(name) > MaxOutputSchemaToolName || len(s.declared) >= MaxOutputSchemaTools:
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

// Declares reports whether the last tools/list answer that listed tool
// said that it declares an outputSchema.
func (s *OutputSchemas) Declares(tool string) bool {
	if s == nil {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.declared[tool]
	return ok
}
