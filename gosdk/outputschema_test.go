package gosdk_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
)

// Under deny_as: result the denial is in _meta too; a tool the server
// listed with an outputSchema (lookup) gets it there only, not as
// structuredContent, which would not match the schema. The middleware
// knows the schemas before any tools/list passed through it: it reads the
// server's own list, every page of it.
func TestDenyAsResultOutputSchema(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		pageSize int
	}{{"one page", 0}, {"a tool a page", 1}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			denyAsResultOutputSchema(t, c.pageSize)
		})
	}
}

func denyAsResultOutputSchema(t *testing.T, pageSize int) {
	s := newServer(t, false, `
tiers:
  free:
    deny_as: result
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1h}
`, options{pageSize: pageSize})
	cs := s.connect(token(t, "schema-co", "alice"))
	ctx := context.Background()
	denied := func(tool string) (*mcp.CallToolResult, enforce.Denial) {
		t.Helper()
		res, err := call(ctx, cs, tool, map[string]any{"text": "x"})
		if err != nil || !res.IsError {
			t.Fatalf("denied %s: %+v, %v; want an isError result", tool, res, err)
		}
		b, _ := json.Marshal(res.Meta[enforce.MetaDenial])
		var d enforce.Denial
		if err := decodeStrict(b, &d); err != nil || d.Rule != "per_tool" || d.Scope != "tenant_tool" || d.RetryAfterSeconds < 1 {
			t.Fatalf("denied %s: _meta %v (%v), want the per_tool denial", tool, res.Meta, err)
		}
		return res, d
	}
	for _, tool := range []string{"lookup", "echo"} {
		if _, err := call(ctx, cs, tool, map[string]any{"text": "x"}); err != nil {
			t.Fatal(err)
		}
	}
	// The client never listed the tools (it did before a restart, or
	// through another replica): the middleware knows the schema all the
	// same, as the gateway does.
	if res, _ := denied("lookup"); res.StructuredContent != nil {
		t.Fatalf("before any tools/list: lookup declares an outputSchema, yet its denial has structuredContent %v", res.StructuredContent)
	}
	if res, _ := denied("echo"); res.StructuredContent == nil {
		t.Fatal("before any tools/list: echo declares no outputSchema, yet its denial has no structuredContent")
	}
	var listed bool
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if tool.Name == "lookup" {
			listed = tool.OutputSchema != nil
		}
	}
	if !listed {
		t.Fatal("lookup lists no outputSchema: the test proves nothing")
	}
	if res, _ := denied("lookup"); res.StructuredContent != nil {
		t.Fatalf("lookup declares an outputSchema, yet its denial has structuredContent %v", res.StructuredContent)
	}
	res, d := denied("echo")
	b, _ := json.Marshal(res.StructuredContent)
	var sc enforce.Denial
	if err := decodeStrict(b, &sc); err != nil || sc != d {
		t.Fatalf("echo: structuredContent %s (%v), want the _meta denial %+v", b, err, d)
	}
}
