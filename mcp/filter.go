package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// List names a list method whose results the proxy can filter: the member
// of the result holding the array, and the member of each entry that a
// Filter's Allow judges.
type List struct {
	Method string // e.g. "resources/list"
	Member string // e.g. "resources"
	Key    string // e.g. "uri"
}

// The list methods MCP servers answer with entries a caller may not see.
var (
	ToolsList             = List{Method: MethodToolsList, Member: "tools", Key: "name"}
	ResourcesList         = List{Method: MethodResourcesList, Member: "resources", Key: "uri"}
	ResourceTemplatesList = List{Method: MethodResourceTemplatesList, Member: "resourceTemplates", Key: "uriTemplate"}
	PromptsList           = List{Method: MethodPromptsList, Member: "prompts", Key: "name"}
)

// Filter removes from the result of one list method the entries Allow
// refuses. The zero Filter (nil Allow) filters nothing.
type Filter struct {
	List List
	// Allow is given each entry's List.Key (a tool or prompt name, a
	// resource URI or URI template) and reports whether the caller may see
	// the entry.
	Allow func(key string) bool
	// Private makes the filtered result say cacheScope "private" (replacing
	// any value the upstream gave, a case-insensitive twin of the member
	// too, or adding the member): a list trimmed to one caller's scopes must
	// not be cached and served to another caller by an intermediary, even
	// when the upstream called its full list "public". The upstream's ttlMs
	// is kept. Serve sets it for requests whose MCP-Protocol-Version has
	// caching hints (HasCachingHints); older versions' results are left
	// without the member.
	Private bool
}

// applies reports whether f filters the answer to m.
func (f Filter) applies(m *Message) bool {
	return f.Allow != nil && m.IsCall() && m.Method == f.List.Method
}

// filterList removes from a list result the entries f.Allow refuses. It
// keeps every other member and the order of everything, compacting the
// result; with f.Private, cacheScope becomes "private". A result it cannot
// read unambiguously (the list member missing, duplicated, beside a
// case-insensitive twin, or not an array of objects) is an error: an
// unfiltered list must not reach the client. An entry without a single
// string key is dropped.
func filterList(result json.RawMessage, f Filter) (json.RawMessage, error) {
	l := f.List
	bad := func(why string) (json.RawMessage, error) {
		return nil, fmt.Errorf("%w: %s result: %s", ErrBadUpstreamResponse, l.Method, why)
	}
	s := jsonscan.New(result)
	if s.Peek() != '{' {
		return bad("not an object")
	}
	out := make([]byte, 0, len(result))
	out = append(out, '{')
	seen, scoped := false, false
	var problem string
	err := s.Object(func(key string) error {
		v, err := s.SkipValue()
		if err != nil {
			return err
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = jsonscan.AppendString(out, key)
		out = append(out, ':')
		if f.Private && strings.EqualFold(key, CacheScopeMember) {
			scoped = true
			out = jsonscan.AppendString(out, CacheScopePrivate)
			return nil
		}
		if key != l.Member {
			if strings.EqualFold(key, l.Member) {
				// encoding/json would read "Tools" as tools: kept
				// unfiltered, it could be the list a client sees.
				problem = "case-insensitive twin of the " + l.Member + " member"
				return nil
			}
			return compactInto(&out, v)
		}
		if seen {
			problem = "duplicate " + l.Member + " member"
			return nil
		}
		seen = true
		kept, why := keepEntries(v, f)
		if why != "" {
			problem = why
			return nil
		}
		out = append(out, kept...)
		return nil
	})
	if err == nil {
		err = s.End()
	}
	switch {
	case err != nil:
		return bad(err.Error())
	case problem != "":
		return bad(problem)
	case !seen:
		return bad("no " + l.Member + " member")
	}
	if f.Private && !scoped {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = jsonscan.AppendString(out, CacheScopeMember)
		out = append(out, ':')
		out = jsonscan.AppendString(out, CacheScopePrivate)
	}
	return append(out, '}'), nil
}

// keepEntries filters the list array v; why is non-empty if v is unusable.
func keepEntries(v []byte, f Filter) (kept []byte, why string) {
	s := jsonscan.New(v)
	if s.Peek() != '[' {
		return nil, f.List.Member + " is not an array"
	}
	kept = append(kept, '[')
	err := s.Array(func() error {
		entry, err := s.SkipValue()
		if err != nil {
			return err
		}
		if entry[0] != '{' {
			why = "an entry of " + f.List.Member + " is not an object"
			return nil
		}
		key, ok := entryKey(entry, f.List.Key)
		if !ok || !f.Allow(key) {
			return nil
		}
		if len(kept) > 1 {
			kept = append(kept, ',')
		}
		return compactInto(&kept, entry)
	})
	if err != nil {
		return nil, err.Error()
	}
	return append(kept, ']'), why
}

// ToolOutputSchemas reads a tools/list result and reports, for each tool
// it lists under a single string name, whether the tool declares an
// outputSchema: a member of that name other than null (a twin in another
// letter case counts too: a client decoding with encoding/json would read
// it). A result without a tools array is an error; entries that are not
// objects, or that have no usable name, are skipped.
func ToolOutputSchemas(result json.RawMessage) (map[string]bool, error) {
	const schema = "outputSchema"
	s := jsonscan.New(result)
	var tools json.RawMessage
	err := s.Object(func(key string) error {
		v, err := s.SkipValue()
		if key == ToolsList.Member {
			tools = v
		}
		return err
	})
	if err == nil {
		err = s.End()
	}
	if err != nil || len(tools) == 0 || tools[0] != '[' {
		return nil, fmt.Errorf("%w: %s result without a %s array", ErrBadUpstreamResponse, MethodToolsList, ToolsList.Member)
	}
	out := map[string]bool{}
	s = jsonscan.New(tools)
	err = s.Array(func() error {
		entry, err := s.SkipValue()
		if err != nil || entry[0] != '{' {
			return err
		}
		name, ok := entryKey(entry, ToolsList.Key)
		if !ok {
			return nil
		}
		declared := false
		es := jsonscan.New(entry)
		_ = es.Object(func(k string) error {
			v, err := es.SkipValue()
			declared = declared || strings.EqualFold(k, schema) && string(v) != "null"
			return err
		})
		out[name] = declared
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s result: %v", ErrBadUpstreamResponse, MethodToolsList, err)
	}
	return out, nil
}

// entryKey returns the member called key of a list entry if the entry has
// exactly one such member and it is a string. A case-insensitive twin
// ("Name" beside "name") makes the entry ambiguous, as in Parse: a client
// decoding with encoding/json could read the twin instead.
func entryKey(entry []byte, key string) (string, bool) {
	s := jsonscan.New(entry)
	var val json.RawMessage
	dup := false
	_ = s.Object(func(k string) error {
		v, err := s.SkipValue()
		switch {
		case k == key:
			dup = dup || val != nil
			val = v
		case strings.EqualFold(k, key):
			dup = true
		}
		return err
	})
	if dup {
		return "", false
	}
	return decodeString(val)
}

func compactInto(dst *[]byte, v []byte) error {
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return err
	}
	*dst = append(*dst, b.Bytes()...)
	return nil
}
