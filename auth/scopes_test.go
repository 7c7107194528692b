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
		// A trailing '*' after a prefix grants every name with that prefix.
		{in: "tools:search__*", tools: []string{"search__*"}, allowed: []string{"search__query", "search__", "search__a/b*"},
			denied: []string{"search_", "search", "Search__query", "files__search__x", "", "*"}, str: "tools:search__*"},
		{in: "tools:search__q tools:b__* tools:search__* tools:a tools:b__*", tools: []string{"a", "b__*", "search__*", "search__q"},
			allowed: []string{"a", "b__x", "search__q", "search__z"}, denied: []string{"b_", "ab__x", "c"}, str: "tools:a tools:b__* tools:search__* tools:search__q"},
		{in: "tools:s* tools:search__*", tools: []string{"s*", "search__*"}, allowed: []string{"s", "search__x", "sx"}, denied: []string{"x"}, str: "tools:s* tools:search__*"},
		{in: "tools:search__* tools:*", all: true, tools: []string{"search__*"}, allowed: []string{"x", "search__x"}, str: "tools:* tools:search__*"},
		// Elsewhere '*' is part of the name.
		{in: "tools:a*b tools:*x", tools: []string{"*x", "a*b"}, allowed: []string{"a*b", "*x"}, denied: []string{"axb", "ab", "yx"}, str: "tools:*x tools:a*b"},
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

// Prefix grants of prompts work as those of tools, apart from them, and
// survive the round trip through String (gosdk passes scopes on that way).
func TestPrefixScopes(t *testing.T) {
	s := ParseScopes("prompts:search__* tools:files__* prompts:x")
	for name, want := range map[string]bool{"search__summary": true, "x": true, "search_": false, "files__read": false} {
		if s.AllowsPrompt(name) != want {
			t.Errorf("AllowsPrompt(%q) = %v", name, !want)
		}
	}
	if s.AllowsTool("search__query") || !s.AllowsTool("files__read") || s.AllPrompts() || s.AllTools() {
		t.Error("tool and prompt prefixes mixed up")
	}
	if got := s.Prompts(); !slices.Equal(got, []string{"search__*", "x"}) {
		t.Errorf("Prompts = %v", got)
	}
	str := s.String()
	if want := "tools:files__* prompts:search__* prompts:x"; str != want {
		t.Errorf("String = %q, want %q", str, want)
	}
	if again := ParseScopes(str); again.String() != str || !again.AllowsPrompt("search__a") || !again.AllowsTool("files__a") {
		t.Errorf("round trip: %q", again.String())
	}
	if n := testing.AllocsPerRun(100, func() {
		_ = s.AllowsTool("files__read")
		_ = s.AllowsTool("nothing")
		_ = s.AllowsPrompt("search__summary")
	}); n != 0 {
		t.Errorf("Allows* allocate %v times", n)
	}
}

func TestParseScopesPromptsAndResources(t *testing.T) {
	s := ParseScopes("tools:* prompts:summarize prompts:review resources:file:///docs/* resources:mem://a resources:file:///docs/* prompts: resources: Prompts:x")
	if !s.AllowsTool("x") || s.AllPrompts() {
		t.Fatal("tools:* or prompts mis-parsed")
	}
	for name, want := range map[string]bool{"summarize": true, "review": true, "Summarize": false, "": false, "x": false, "*": false} {
		if s.AllowsPrompt(name) != want {
			t.Errorf("AllowsPrompt(%q) = %v", name, !want)
		}
	}
	for uri, want := range map[string]bool{
		"file:///docs/a.md": true, "file:///docs/sub/dir/b": true, "file:///docs/": true,
		"file:///docs": false, "file:///secret/docs/a": false, "mem://a": true, "mem://ab": false, "": false,
	} {
		if s.AllowsResource(uri) != want {
			t.Errorf("AllowsResource(%q) = %v", uri, !want)
		}
	}
	if got := s.Resources(); !slices.Equal(got, []string{"file:///docs/*", "mem://a"}) {
		t.Errorf("Resources = %v", got)
	}
	if got, want := s.String(), "tools:* prompts:review prompts:summarize resources:file:///docs/* resources:mem://a"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	all := ParseScopes("prompts:* resources:*")
	if !all.AllPrompts() || !all.AllowsPrompt("any") || !all.AllowsResource("x://y/z") || !all.AllowsResource("") || all.AllowsTool("t") {
		t.Fatal("prompts:* resources:* mis-parsed")
	}
	var zero Scopes
	if zero.AllowsPrompt("p") || zero.AllowsResource("file:///a") || zero.AllowsResourceTemplate("file:///{x}") || zero.AllowsResourceTemplate("") {
		t.Fatal("zero Scopes grants a prompt or a resource")
	}
	if tools := ParseScopes("tools:*"); tools.AllowsPrompt("p") || tools.AllowsResource("a") {
		t.Fatal("tools:* grants prompts or resources")
	}
}

func TestAllowsResourceTemplate(t *testing.T) {
	cases := []struct {
		scopes, tmpl string
		want         bool
	}{
		{"resources:*", "file:///{path}", true},
		{"resources:*", "{+any}", true},
		{"resources:file:///docs/*", "file:///docs/{name}", true},
		{"resources:file:///docs/*", "file:///docs/api/{name}{?v}", true},
		{"resources:file:///*", "file:///docs/{name}", true},
		{"resources:file:///docs/*", "file:///{dir}/readme", false},      // expands outside docs
		{"resources:file:///docs/*", "file:///docsx/{name}", false},      // "docsx" is not under "docs/"
		{"resources:file:///docs/*.md", "file:///docs/{name}.md", false}, // not a prefix glob
		{"resources:*/docs/*", "file:///docs/{name}", false},
		{"resources:file:///docs/{name}", "file:///docs/{name}", false}, // the glob is a literal URI
		{"resources:file:///docs/a", "file:///docs/a", true},            // no expression: one URI
		{"resources:file:///docs/*", "file:///docs/a", true},
		{"resources:file:///docs/*", "file:///other", false},
		{"tools:* prompts:*", "file:///{x}", false},
		// every expansion of an ambiguous prefix is refused: so is the template
		{"resources:file:///docs/*", "file:///docs/../secret/{name}", false},
		{"resources:*", "file:///docs/../secret/{name}", true},
	}
	for _, c := range cases {
		if got := ParseScopes(c.scopes).AllowsResourceTemplate(c.tmpl); got != c.want {
			t.Errorf("%q: AllowsResourceTemplate(%q) = %v, want %v", c.scopes, c.tmpl, got, c.want)
		}
	}
}

func TestMatchGlob(t *testing.T) {
	cases := []struct {
		glob, s string
		want    bool
	}{
		{"", "", true},
		{"", "a", false},
		{"*", "", true},
		{"*", "any/thing:at all", true},
		{"abc", "abc", true},
		{"abc", "abcd", false},
		{"abc", "ab", false},
		{"a*", "a", true},
		{"a*", "ab/c", true},
		{"a*", "ba", false},
		{"*a", "ba", true},
		{"*a", "ab", false},
		{"a*a", "a", false}, // head and tail must not overlap
		{"a*a", "aa", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "a/x/b/y/c", true},
		{"a*b*c", "acb", false},
		{"a*b*b", "abb", true},
		{"*b*b", "bb", true},
		{"*b*b", "b", false},
		{"**", "x", true},
		{"file:///docs/*", "file:///docs/a/b.md", true},
		{"file:///docs/*", "file:///docs", false},
		{"file:///*.md", "file:///docs/a.md", true},
		{"file:///*.md", "file:///docs/a.mdx", false},
		{"a?c", "abc", false}, // '?' is literal
		{"a?c", "a?c", true},
		{"[ab]", "a", false},   // '[' is literal
		{`a\*`, `a\xyz`, true}, // no escape: '\' is literal, '*' still a wildcard
		{"ABC", "abc", false},
		{"é*", "é!", true},
	}
	for _, c := range cases {
		if got := MatchGlob(c.glob, c.s); got != c.want {
			t.Errorf("MatchGlob(%q, %q) = %v, want %v", c.glob, c.s, got, c.want)
		}
		if got := globOracle(c.glob, c.s); got != c.want {
			t.Errorf("oracle(%q, %q) = %v: the table is wrong", c.glob, c.s, got)
		}
	}
}

// globOracle is MatchGlob's definition, written another way: each '*'
// stands for any run of bytes, every other byte for itself, decided by a
// dynamic program over bytes (no greedy scan), so that it takes any input,
// invalid UTF-8 included. m[j] says whether the glob read so far matches
// s[:j].
func globOracle(glob, s string) bool {
	m := make([]bool, len(s)+1)
	m[0] = true
	for i := 0; i < len(glob); i++ {
		next := make([]bool, len(s)+1)
		for j := range next {
			switch {
			case glob[i] == '*':
				next[j] = m[j] || j > 0 && next[j-1]
			case j > 0:
				next[j] = m[j-1] && s[j-1] == glob[i]
			}
		}
		m = next
	}
	return m[len(s)]
}

func FuzzMatchGlob(f *testing.F) {
	for _, seed := range [][2]string{{"a*b", "axxb"}, {"*", ""}, {"file:///docs/*", "file:///docs/x"}, {"a*a*a", "aaaa"}, {"*.md", "x.md"}} {
		f.Add(seed[0], seed[1])
	}
	f.Add("\xff*\xfe", "\xff\x80\xfe") // invalid UTF-8 is matched byte by byte
	f.Fuzz(func(t *testing.T, glob, s string) {
		if got, want := MatchGlob(glob, s), globOracle(glob, s); got != want {
			t.Fatalf("MatchGlob(%q, %q) = %v, oracle says %v", glob, s, got, want)
		}
	})
}

// A resource glob is text, so URIs an upstream resolves to another path
// than they spell are refused unless the caller holds resources:*.
func TestAllowsResourceRefusesAmbiguousURIs(t *testing.T) {
	docs := ParseScopes("resources:file:///docs/*")
	all := ParseScopes("resources:*")
	for _, uri := range []string{
		"file:///docs/../etc/passwd",
		"file:///docs/%2e%2e/secrets",
		"file:///docs/%2E%2e/secrets",
		"file:///docs/./../x",
		"file:///docs/..",
		"file:///docs/a%2f..%2f..%2fetc",
		"file:///docs/a%5c..%5cetc",
		"file:///docs/a\\..\\etc",
		"file:///docs/a\x00b",
		"file:///docs/a%00b",
		"file:///docs/x?/../../secret",
		"file:///docs/x#/%2e%2e/secret",
		// the path ends at '?' or '#': "/docs/.."
		"file:///docs/..?x",
		"file:///docs/..#x",
		"file:///docs/%2e%2e?",
		// WHATWG URL parsers (new URL, the TypeScript SDK's) delete tab, LF
		// and CR: "/docs/../secret/keys.txt" to them
		"file:///docs/.\t./secret/keys.txt",
		"file:///docs/.\n./secret/keys.txt",
		"file:///docs/\r../secret/keys.txt",
		"file:///docs/a\x7fb",
	} {
		if !AmbiguousURI(uri) {
			t.Errorf("AmbiguousURI(%q) = false", uri)
		}
		if docs.AllowsResource(uri) {
			t.Errorf("resources:file:///docs/* allows %q", uri)
		}
		if !all.AllowsResource(uri) {
			t.Errorf("resources:* refuses %q", uri)
		}
	}
	for _, uri := range []string{"file:///docs/a.md", "file:///docs/.hidden", "file:///docs/a..b/c", "file:///docs/x?q=../y"} {
		if AmbiguousURI(uri) || !docs.AllowsResource(uri) {
			t.Errorf("file:///docs/* refuses the plain URI %q", uri)
		}
	}
}
