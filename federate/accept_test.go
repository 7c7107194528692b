package federate_test

import (
	"context"
	"errors"
	"log/slog"
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
