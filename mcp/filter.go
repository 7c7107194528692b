package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// filterTools removes from a tools/list result the tools allow refuses. It
// keeps every other member and the order of everything, compacting the
// result. A result it cannot read unambiguously (tools not an array of
// objects, a duplicate "tools") is an error: an unfiltered list must not
// reach the client. A tool without a single string name is dropped.
func filterTools(result json.RawMessage, allow func(string) bool) (json.RawMessage, error) {
	bad := func(why string) (json.RawMessage, error) {
		return nil, fmt.Errorf("%w: tools/list result: %s", ErrBadUpstreamResponse, why)
	}
	s := scanner{data: result}
	if s.peek() != '{' {
		return bad("not an object")
	}
	out := make([]byte, 0, len(result))
	out = append(out, '{')
	seenTools := false
	var problem string
	err := s.object(func(key string) error {
		v, err := s.skipValue()
		if err != nil {
			return err
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = appendCanonicalString(out, key)
		out = append(out, ':')
		if key != "tools" {
			return compactInto(&out, v)
		}
		if seenTools {
			problem = "duplicate tools member"
			return nil
		}
		seenTools = true
		kept, why := keepTools(v, allow)
		if why != "" {
			problem = why
			return nil
		}
		out = append(out, kept...)
		return nil
	})
	if err == nil {
		err = s.end()
	}
	switch {
	case err != nil:
		return bad(err.Error())
	case problem != "":
		return bad(problem)
	case !seenTools:
		return bad("no tools member")
	}
	return append(out, '}'), nil
}

// keepTools filters the tools array v; why is non-empty if v is unusable.
func keepTools(v []byte, allow func(string) bool) (kept []byte, why string) {
	s := scanner{data: v}
	if s.peek() != '[' {
		return nil, "tools is not an array"
	}
	kept = append(kept, '[')
	err := s.array(func() error {
		tool, err := s.skipValue()
		if err != nil {
			return err
		}
		if tool[0] != '{' {
			why = "a tool is not an object"
			return nil
		}
		name, ok := toolName(tool)
		if !ok || !allow(name) {
			return nil
		}
		if len(kept) > 1 {
			kept = append(kept, ',')
		}
		return compactInto(&kept, tool)
	})
	if err != nil {
		return nil, err.Error()
	}
	return append(kept, ']'), why
}

// toolName returns the tool's name if it has exactly one string "name".
func toolName(tool []byte) (string, bool) {
	s := scanner{data: tool}
	var name json.RawMessage
	dup := false
	_ = s.object(func(key string) error {
		v, err := s.skipValue()
		if key == "name" {
			dup = dup || name != nil
			name = v
		}
		return err
	})
	if dup {
		return "", false
	}
	return decodeString(name)
}

func compactInto(dst *[]byte, v []byte) error {
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return err
	}
	*dst = append(*dst, b.Bytes()...)
	return nil
}
