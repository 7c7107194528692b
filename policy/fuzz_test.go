package policy

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/keyspace"
)

// yamlBreaks turns every YAML line break into "\n".
var yamlBreaks = strings.NewReplacer("\r\n", "\n", "\r", "\n", "\u0085", "\n", "\u2028", "\n", "\u2029", "\n")

func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("testdata/mcpgate.example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(head))
	f.Add([]byte(""))
	f.Add([]byte(head + "x: &a [*a]\ntools: {t: {<<: [{cost: 2}, {on_error: open}]}}\n"))
	f.Add([]byte(head + "upstream: {headers: {A: \"${B} $${C}\"}}\n"))
	for _, tc := range badConfigs {
		f.Add([]byte(head + tc.yaml))
	}
	for _, tc := range badWhole {
		f.Add([]byte(tc.yaml))
	}
	for _, tc := range badUpstreams {
		f.Add([]byte(upHead + tc.yaml))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.yaml", data)
		lines := 1 + strings.Count(yamlBreaks.Replace(string(data)), "\n")
		if err != nil {
			if c != nil {
				t.Fatal("config and error both returned")
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %T is not a non-empty Errors: %v", err, err)
			}
			prev := 0
			for _, e := range es {
				if e.Line < 1 || e.Line > lines {
					t.Fatalf("line %d outside the file's %d lines: %v", e.Line, lines, e)
				}
				if e.Line < prev {
					t.Fatalf("problems not sorted by line:\n%v", err)
				}
				prev = e.Line
				if !strings.HasPrefix(e.Error(), fmt.Sprintf("f.yaml:%d: ", e.Line)) || e.Msg == "" {
					t.Fatalf("badly formed problem %q", e.Error())
				}
			}
			return
		}
		// A config that loads is consistent.
		if c.Upstream.URL == "" && len(c.Upstreams) == 0 || c.Listen == "" || c.Store.Timeout <= 0 || !c.Store.OnError.Valid() {
			t.Fatalf("defaults missing: %+v", c)
		}
		if _, ok := c.Tiers[c.DefaultTier]; len(c.Tiers) > 0 && !ok {
			t.Fatalf("default tier %q not in tiers", c.DefaultTier)
		}
		for _, w := range c.Warnings {
			if !strings.HasPrefix(w, "f.yaml:") {
				t.Fatalf("warning without a position: %q", w)
			}
		}
		tiers := []string{"", "no such tier"}
		for name := range c.Tiers {
			tiers = append(tiers, name)
		}
		tools := []string{"", "no such tool"}
		for name := range c.Tools {
			tools = append(tools, name)
		}
		for _, u := range c.Upstreams {
			if u.Timeout <= 0 || u.Prefix == "" && len(u.Limits) > 0 && len(c.Upstreams) > 1 {
				t.Fatalf("upstream %+v", u)
			}
			tools = append(tools, u.Prefix+"x")
			if name, ok := c.UpstreamOf(u.Prefix + "x"); u.Prefix != "" && (!ok || name != u.Name) {
				t.Fatalf("UpstreamOf(%q) = %q, %v, want %q", u.Prefix+"x", name, ok, u.Name)
			}
		}
		for _, tier := range tiers {
			for _, tool := range tools {
				scoped, global := c.RulesFor(tier, tool)
				seen := map[string]bool{}
				for _, r := range scoped {
					if err := r.Validate(); err != nil || !r.Per.TenantScoped() {
						t.Fatalf("bad tenant-scoped rule %+v: %v", r, err)
					}
					if k := keyspace.RateLimit(r.Per, r.Name, keyspace.Owner{Tenant: "t", Subject: "s", Tool: tool}); seen[k] {
						t.Fatalf("two rules of one call share counter %s", k)
					} else {
						seen[k] = true
					}
				}
				for _, r := range global {
					if err := r.Validate(); err != nil || r.Per != keyspace.PerGlobal {
						t.Fatalf("bad global rule %+v: %v", r, err)
					}
				}
				if cost := c.ToolCost(tool); cost.Charge() < 1 {
					t.Fatalf("cost %+v", cost)
				}
				if !c.ToolOnError(tool).Valid() {
					t.Fatalf("on_error %q", c.ToolOnError(tool))
				}
			}
		}
	})
}
