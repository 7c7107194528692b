package cache

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func TestRenderTags(t *testing.T) {
	tests := []struct {
		templates []string
		args      string
		want      []string
	}{
		{[]string{"product:{{args.id}}"}, `{"id":42}`, []string{"product:42"}},
		{[]string{"product:{{args.id}}"}, `{"id":42.0}`, []string{"product:42"}},
		{[]string{"product:{{args.id}}"}, `{"id":4.2e1}`, []string{"product:42"}},
		{[]string{"product:{{ args.id }}"}, `{"id":"abc"}`, []string{"product:abc"}},
		{[]string{"{{args.a.b}}/{{args.a.c}}"}, `{"a":{"b":"x","c":true}}`, []string{"x/true"}},
		{[]string{"item:{{args.items.1}}"}, `{"items":["a","b"]}`, []string{"item:b"}},
		{[]string{"item:{{args.items.01}}", "item:{{args.items.9}}"}, `{"items":["a","b"]}`, []string{"item:", "item:"}},
		{[]string{"x:{{args.missing}}", "n:{{args.n}}"}, `{"n":null}`, []string{"x:", "n:"}},
		{[]string{"obj:{{args.o}}"}, `{"o":{"b":1.0,"a":[2]}}`, []string{`obj:{"a":[2],"b":1}`}},
		{[]string{"all:{{args}}"}, ` { "b" : 1, "a" : 2 } `, []string{`all:{"a":2,"b":1}`}},
		{[]string{"static", "a}}b"}, `{}`, []string{"static", "a}}b"}},
		{[]string{"p:{{args.id}}"}, ``, []string{"p:"}},
		{nil, `{}`, nil},
	}
	for _, tt := range tests {
		got, err := RenderTags(tt.templates, json.RawMessage(tt.args))
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("RenderTags(%q, %s) = %q, %v; want %q", tt.templates, tt.args, got, err, tt.want)
		}
	}
}

func TestRenderTagsErrors(t *testing.T) {
	for _, tpl := range []string{"p:{{args.id", "{{id}}", "{{args..a}}", "{{args.}}", "{{ }}", "{{argsx}}"} {
		if _, err := CompileTags([]string{tpl}); !errors.Is(err, ErrInvalidTemplate) {
			t.Errorf("CompileTags(%q) = %v, want ErrInvalidTemplate", tpl, err)
		}
	}
	if _, err := RenderTags([]string{"p:{{args.id}}"}, json.RawMessage(`{"id":`)); !errors.Is(err, ErrInvalidArguments) {
		t.Errorf("invalid arguments: %v", err)
	}
	// Templates without placeholders never parse the arguments.
	if got, err := RenderTags([]string{"static"}, json.RawMessage(`{"id":`)); err != nil || got[0] != "static" {
		t.Errorf("static template: %q %v", got, err)
	}
}

// TestTagsAgree checks the property invalidation relies on: the cached
// tool's tags and the mutating tool's invalidates render alike for
// equivalent arguments.
func TestTagsAgree(t *testing.T) {
	cached, err := CompileTags([]string{"product:{{args.id}}"})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := cached.Render(json.RawMessage(`{"id": 1e2, "q": "x"}`))
	b, _ := cached.Render(json.RawMessage(`{"price": 3, "id": 100}`))
	if !slices.Equal(a, b) {
		t.Fatalf("%q != %q", a, b)
	}
}
