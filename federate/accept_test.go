package federate_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// Options.AcceptTool is asked about every tool an upstream exposes: at
// start (a refusal fails New) and at every later listing (a refused name
// is logged and never exposed, the rest is).
func TestAcceptTool(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "u", Version: "1"}, nil)
	handler := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	object := map[string]any{"type": "object"}
	srv.AddTool(&mcp.Tool{Name: "ok", InputSchema: object}, handler)
	url := serveSDK(t, srv)
	accept := func(upstream, tool string) error {
		if strings.Contains(tool, "bad") {
			return errors.New("refused by the test")
		}
		return nil
	}
	var logs testenv.SyncBuffer
	f, cs := start(t, federate.Options{AcceptTool: accept, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Upstreams: []federate.Upstream{{Name: "u", URL: url, Prefix: "u__"}}}, nil)
	srv.AddTool(&mcp.Tool{Name: "bad_x", InputSchema: object}, handler) // list_changed
	srv.AddTool(&mcp.Tool{Name: "good", InputSchema: object}, handler)
	testenv.Eventually(t, waitLong, "the new listing to be installed", func() bool { _, ok := f.UpstreamOf("u__good"); return ok })
	if _, ok := f.UpstreamOf("u__bad_x"); ok {
		t.Error("a tool AcceptTool refused is exposed")
	}
	// Logged right after the listing is installed.
	testenv.Eventually(t, waitLong, "the refused tool to be logged", func() bool { return strings.Contains(logs.String(), "refused by the test") })
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if tool.Name == "u__bad_x" {
			t.Error("a client lists a tool AcceptTool refused")
		}
	}
	// At start, a refused tool fails New.
	_, err := federate.New(context.Background(), federate.Options{AcceptTool: accept, Logger: slog.New(slog.DiscardHandler),
		Upstreams: []federate.Upstream{{Name: "u", URL: url, Prefix: "u__"}}})
	if err == nil || !strings.Contains(err.Error(), "refused by the test") {
		t.Errorf("New with an upstream exposing a refused tool: %v", err)
	}
}

// A prompt whose exposed name reads as another upstream's (a bare
// upstream's a__x, upstream a having prefix a__) is refused, as a scope
// naming a's prompts would reach it: at start it fails New, naming both
// upstreams; the others are exposed.
func TestPromptReadingAsAnotherUpstreamsIsRefused(t *testing.T) {
	prompt := func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{}, nil
	}
	a := mcp.NewServer(&mcp.Implementation{Name: "a", Version: "1"}, nil)
	a.AddPrompt(&mcp.Prompt{Name: "greet"}, prompt)
	b := mcp.NewServer(&mcp.Implementation{Name: "b", Version: "1"}, nil)
	b.AddPrompt(&mcp.Prompt{Name: "a__x"}, prompt)
	ups := []federate.Upstream{{Name: "a", URL: serveSDK(t, a), Prefix: "a__"}, {Name: "b", URL: serveSDK(t, b)}}
	_, err := federate.New(context.Background(), federate.Options{Logger: slog.New(slog.DiscardHandler), Upstreams: ups})
	if !errors.Is(err, federate.ErrMisattributed) || !strings.Contains(err.Error(), `"a__x" reads as upstream "a"'s`) || !strings.Contains(err.Error(), `upstream "b"`) {
		t.Fatalf("New with a bare upstream exposing prompt a__x: %v, want ErrMisattributed", err)
	}
	// b__a__x, with a prefix of its own, reads as b's.
	ups[1].Prefix = "b__"
	_, cs := start(t, federate.Options{Upstreams: ups}, nil)
	var names []string
	for p, err := range cs.Prompts(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, p.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a__greet", "b__a__x"}) {
		t.Errorf("prompts/list = %v", names)
	}
}
