package federate_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// addDoc makes s, named name, list the resource uri, whose text names s.
func addDoc(s *mcp.Server, uri, name string) {
	s.AddResource(&mcp.Resource{URI: uri, Name: "doc"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "doc of " + name}}}, nil
	})
}

// A URI two upstreams list belongs to the first in configuration order,
// whatever the order their listings change in: when the first stops
// listing it, the second serves it; when the first lists it again
// (after the second's listing changed meanwhile), the first serves it
// again.
func TestSharedResourceFollowsConfigurationOrder(t *testing.T) {
	a, b := mcp.NewServer(&mcp.Implementation{Name: "a", Version: "1"}, nil), mcp.NewServer(&mcp.Implementation{Name: "b", Version: "1"}, nil)
	addDoc(a, "test://shared/doc", "a")
	addDoc(b, "test://shared/doc", "b")
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: serveSDK(t, a)}, {Name: "b", URL: serveSDK(t, b)}}}, nil)
	readsFrom := func(want string) func() bool {
		return func() bool {
			res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "test://shared/doc"})
			return err == nil && len(res.Contents) == 1 && res.Contents[0].Text == "doc of "+want
		}
	}
	testenv.Eventually(t, waitLong, "reads from a", readsFrom("a"))
	a.RemoveResources("test://shared/doc")
	testenv.Eventually(t, waitLong, "reads from b once a no longer lists it", readsFrom("b"))
	addDoc(b, "test://b/other", "b")
	testenv.Eventually(t, waitLong, "b's new listing", func() bool {
		_, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "test://b/other"})
		return err == nil
	})
	addDoc(a, "test://shared/doc", "a")
	testenv.Eventually(t, waitLong, "reads from a once it lists it again", readsFrom("a"))
}

// At start, a URI or template several upstreams list goes to the first
// in configuration order, and each other upstream's is logged once, in
// configuration order.
func TestSharedResourceAtStartLogged(t *testing.T) {
	var ups []federate.Upstream
	for _, name := range []string{"a", "b", "c"} {
		s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
		addDoc(s, "test://shared/doc", name)
		if name != "a" {
			s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://shared/items/{id}", Name: "items"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item of " + name}}}, nil
			})
		}
		ups = append(ups, federate.Upstream{Name: name, URL: serveSDK(t, s)})
	}
	var logs testenv.SyncBuffer
	_, cs := start(t, federate.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Upstreams: ups}, nil)
	var shadowed []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct{ Msg, Detail string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Msg == "federate: a resource two upstreams list goes to the first" {
			shadowed = append(shadowed, rec.Detail)
		}
	}
	want := []string{
		`resource "test://shared/doc" of upstream "b" is served by upstream "a"`,
		`resource "test://shared/doc" of upstream "c" is served by upstream "a"`,
		`resource template "test://shared/items/{id}" of upstream "c" is served by upstream "b"`,
	}
	if !slices.Equal(shadowed, want) {
		t.Fatalf("logged %q, want %q", shadowed, want)
	}
	for uri, text := range map[string]string{"test://shared/doc": "doc of a", "test://shared/items/1": "item of b"} {
		res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
		if err != nil || len(res.Contents) != 1 || res.Contents[0].Text != text {
			t.Fatalf("read %s = %v, %v; want %q", uri, res, err, text)
		}
	}
}

// holdingHandler is a slog handler that holds the first record whose
// message is msg, for upstream up, until release is closed: the refresh
// logging it waits there, between its catalog update and its install.
type holdingHandler struct {
	msg, up string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *holdingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *holdingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != h.msg {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "upstream" && a.Value.String() == h.up {
			h.once.Do(func() {
				close(h.entered)
				<-h.release
			})
			return false
		}
		return true
	})
	return nil
}
func (h *holdingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *holdingHandler) WithGroup(string) slog.Handler      { return h }

// toolServer is an upstream named name serving tools, each answering
// name:tool.
func toolServer(name string, tools ...string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
	for _, tool := range tools {
		addNamedTool(s, name, tool)
	}
	return s
}

func addNamedTool(s *mcp.Server, upstream, tool string) {
	s.AddTool(&mcp.Tool{Name: tool, InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: upstream + ":" + tool}}}, nil
	})
}

// listedTools is the tools/list of cs.
func listedTools(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tool := range res.Tools {
		out = append(out, tool.Name)
	}
	return out
}

// A tool moving from one upstream to another stays served: a stops
// listing x, b starts listing it, and b's refresh comes between a's
// catalog update and a's install. a's install removes x as gone from a:
// it must not remove b's x, which the catalog routes to b (refreshes of
// two upstreams install one at a time, in the catalog's order).
func TestToolMovingBetweenUpstreamsStaysServed(t *testing.T) {
	a, b := toolServer("a", "x", "z"), toolServer("b", "y")
	bListedX := make(chan struct{})
	var bListedOnce sync.Once
	b.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if l, ok := res.(*mcp.ListToolsResult); ok && slices.ContainsFunc(l.Tools, func(t *mcp.Tool) bool { return t.Name == "x" }) {
				bListedOnce.Do(func() { close(bListedX) })
			}
			return res, err
		}
	})
	var refuseZ atomic.Bool
	hold := &holdingHandler{msg: "federate: upstream entry not exposed", up: "a", entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hold.release) }) }
	t.Cleanup(release)
	f, cs := start(t, federate.Options{
		Logger:    slog.New(hold),
		Upstreams: []federate.Upstream{{Name: "a", URL: serveSDK(t, a), Prefix: ""}, {Name: "b", URL: serveSDK(t, b), Prefix: ""}},
		AcceptTool: func(_, tool string) error {
			if refuseZ.Load() && tool == "z" {
				return errors.New("z refused")
			}
			return nil
		},
	}, nil)
	if up, _ := f.UpstreamOf("x"); up != "a" {
		t.Fatalf("x served by %q, want a", up)
	}
	// a's refresh: its catalog update drops x (and z, refused: logged,
	// and held there, before its install).
	refuseZ.Store(true)
	a.RemoveTools("x")
	select {
	case <-hold.entered:
	case <-time.After(waitLong):
		t.Fatal("a's refresh never logged its refused tool")
	}
	// b's refresh: it lists x, then updates the catalog and installs, or
	// waits for a's install to do so.
	addNamedTool(b, "b", "x")
	select {
	case <-bListedX:
	case <-time.After(waitLong):
		t.Fatal("b was never listed again")
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if up, _ := f.UpstreamOf("x"); up == "b" {
			break // b's refresh went on (not waiting for a's install)
		}
	}
	release()
	testenv.Eventually(t, waitLong, "x served by b, listed and callable, and z gone", func() bool {
		up, _ := f.UpstreamOf("x")
		tools := listedTools(t, cs)
		if up != "b" || !slices.Contains(tools, "x") || slices.Contains(tools, "z") {
			return false
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "x", Arguments: map[string]any{}})
		return err == nil && !res.IsError && testenv.ToolText(res) == "b:x"
	})
}

// rawLister is a bare Streamable HTTP MCP server whose tools/list answers
// tools (a JSON array) as given: what an SDK server would not list.
func rawLister(tools string) http.Handler {
	return rawServer("raw", `{"tools":{}}`, func(_ http.ResponseWriter, _ json.RawMessage, method string) (string, bool) {
		switch method {
		case "tools/list":
			return `{"tools":` + tools + `}`, false
		case "tools/call":
			return `{"content":[{"type":"text","text":"called"}]}`, false
		}
		return "", false
	})
}

// A tool an upstream lists more than once is exposed and counted once
// (Health.Tools, /readyz), and the repeat is logged once.
func TestRepeatedToolCountedOnce(t *testing.T) {
	x := `{"name":"x","inputSchema":{"type":"object"}}`
	ts := httptest.NewServer(rawLister("[" + x + "," + x + "," + x + `,{"name":"y","inputSchema":{"type":"object"}}]`))
	t.Cleanup(ts.Close)
	var logs testenv.SyncBuffer
	f, cs := start(t, federate.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Upstreams: []federate.Upstream{{Name: "raw", URL: ts.URL + "/mcp"}}}, nil)
	listed := listedTools(t, cs)
	if h := f.Health()[0]; h.Tools != 2 || len(listed) != 2 {
		t.Fatalf("tools/list = %v, Health.Tools = %d; want 2 and 2", listed, h.Tools)
	}
	if n := strings.Count(logs.String(), "lists a name twice"); n != 1 {
		t.Fatalf("the repeated x logged %d times, want once:\n%s", n, logs.String())
	}
}
