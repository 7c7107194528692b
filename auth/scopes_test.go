package auth

import (
	"slices"
	"testing"
)

func TestParseScopes(t *testing.T) {
	cases := []struct {
		in      string
		all     bool
		tools   []string
		allowed []string
		denied  []string
		str     string
	}{
		{in: "", denied: []string{"search", "*", ""}},
		{in: "openid profile", denied: []string{"openid", "profile"}},
		{in: "tools:search", tools: []string{"search"}, allowed: []string{"search"}, denied: []string{"Search", "search2", "fetch"}, str: "tools:search"},
		{in: "  tools:b\ttools:a \n tools:b ", tools: []string{"a", "b"}, allowed: []string{"a", "b"}, denied: []string{"c"}, str: "tools:a tools:b"},
		{in: "tools:* email", all: true, allowed: []string{"search", "anything/at.all"}, str: "tools:*"},
		{in: "tools:x tools:*", all: true, tools: []string{"x"}, allowed: []string{"x", "y"}, str: "tools:* tools:x"},
		{in: "tools: tool:x Tools:y tools", denied: []string{"", "x", "y"}},
		{in: "tools:a:b tools:ns/tool", tools: []string{"a:b", "ns/tool"}, allowed: []string{"a:b", "ns/tool"}, denied: []string{"a"}, str: "tools:a:b tools:ns/tool"},
	}
	for _, c := range cases {
		s := ParseScopes(c.in)
		if s.AllTools() != c.all {
			t.Errorf("%q: AllTools = %v", c.in, s.AllTools())
		}
		if got := s.Tools(); !slices.Equal(got, c.tools) && (len(got) != 0 || len(c.tools) != 0) {
			t.Errorf("%q: Tools = %v, want %v", c.in, got, c.tools)
		}
		for _, name := range c.allowed {
			if !s.AllowsTool(name) {
				t.Errorf("%q: %q not allowed", c.in, name)
			}
		}
		for _, name := range c.denied {
			if s.AllowsTool(name) {
				t.Errorf("%q: %q allowed", c.in, name)
			}
		}
		if s.String() != c.str {
			t.Errorf("%q: String = %q, want %q", c.in, s.String(), c.str)
		}
	}
	var zero Scopes
	if zero.AllowsTool("x") || zero.AllTools() || zero.String() != "" {
		t.Fatal("zero Scopes grants something")
	}
}
