package federate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// sizeServer has one tool, size, answering the length of its arguments as
// they arrived (JSON; not decoded: a large call stays quick under -race).
func sizeServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "size", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "size", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(len(req.Params.Arguments))}}}, nil
	})
	return s
}

// A request of a client without a session (here: an older client's
// tools/call), read to see whether it is an initialize, reaches the
// upstream whole however large: past the 16 MiB the check reads, too.
func TestLargeStatelessRequestArrivesWhole(t *testing.T) {
	up := serveSDKWith(t, sizeServer(), &mcp.StreamableHTTPOptions{MaxRequestBodyBytes: 64 << 20})
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "s", URL: up, Prefix: "s__"}}})
	args := `{"text":"` + strings.Repeat("x", 16<<20+4096) + `"}`
	resp, out := postRaw(t, url, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"s__size","arguments":`+args+`}}`)
	if want := fmt.Sprintf(`"text":"%d"`, len(args)); resp.StatusCode != http.StatusOK || !strings.Contains(string(out), want) {
		t.Fatalf("answer: %d %.500s; want the size %d", resp.StatusCode, out, len(args))
	}
}

// A Federator of its own bound refuses a larger request with 413.
func TestMaxRequestBytes(t *testing.T) {
	up := serveSDK(t, sizeServer())
	_, url := serve(t, federate.Options{MaxRequestBytes: 1 << 20, Upstreams: []federate.Upstream{{Name: "s", URL: up, Prefix: "s__"}}})
	resp, _ := postRaw(t, url, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"s__size","arguments":{"text":"`+strings.Repeat("x", 2<<20)+`"}}}`)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
}

// endlessLister is an upstream with a tool keep whose tools/list, once
// endless is set, answers perPage fresh tools and a fresh nextCursor on
// every page, for ever (a hostile or broken server).
type endlessLister struct {
	srv     *mcp.Server
	url     string
	endless atomic.Bool
	perPage int
	pages   atomic.Int64 // endless pages served
}

func startEndlessLister(t *testing.T, perPage int) *endlessLister {
	e := &endlessLister{perPage: perPage}
	e.srv = mcp.NewServer(&mcp.Implementation{Name: "endless", Version: "1"}, nil)
	e.srv.AddTool(&mcp.Tool{Name: "keep", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "kept"}}}, nil
	})
	e.srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "tools/list" || !e.endless.Load() {
				return next(ctx, method, req)
			}
			n := e.pages.Add(1)
			res := &mcp.ListToolsResult{NextCursor: fmt.Sprintf("page-%d", n+1)}
			for i := range e.perPage {
				res.Tools = append(res.Tools, &mcp.Tool{Name: fmt.Sprintf("t%d_%d", n, i), InputSchema: map[string]any{"type": "object"}})
			}
			return res, nil
		}
	})
	e.url = serveSDK(t, e.srv)
	return e
}

// An upstream listing endless pages at start-up fails New, naming it and
// the bound, once MaxListPages pages were read.
func TestEndlessListingAtStartup(t *testing.T) {
	e := startEndlessLister(t, 1)
	e.endless.Store(true)
	// A StartTimeout far above the time the bound takes: past it, the
	// listing would fail for the time it took, not for its size.
	f, err := federate.New(context.Background(), federate.Options{StartTimeout: time.Minute, Logger: slog.New(slog.DiscardHandler),
		Upstreams: []federate.Upstream{{Name: "e", URL: e.url, Prefix: "e__"}}})
	if err == nil {
		f.Close()
		t.Fatal("New took an upstream listing endless pages")
	}
	want := fmt.Sprintf("more than %d pages", federate.MaxListPages)
	if !errors.Is(err, federate.ErrStart) || !strings.Contains(err.Error(), `upstream "e"`) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want ErrStart naming e and %q", err, want)
	}
	if n := e.pages.Load(); n != federate.MaxListPages {
		t.Errorf("%d pages read, want %d", n, federate.MaxListPages)
	}
}

// An upstream whose listing grows past MaxListEntries after a
// list_changed keeps its previous listing (still callable), none of the
// new one is exposed, and the error is logged.
func TestEndlessListingOnRefresh(t *testing.T) {
	e := startEndlessLister(t, 100)
	var gwlog testenv.SyncBuffer
	_, cs := start(t, federate.Options{StartTimeout: time.Minute,
		Logger:    slog.New(slog.NewJSONHandler(&gwlog, nil)),
		Upstreams: []federate.Upstream{{Name: "e", URL: e.url, Prefix: "e__"}}}, nil)
	if got, isErr := callText(t, cs, "e__keep", nil); got != "kept" || isErr {
		t.Fatalf("e__keep = %q (isError %v)", got, isErr)
	}
	e.endless.Store(true)
	// A new tool: the upstream tells its sessions its list changed.
	e.srv.AddTool(&mcp.Tool{Name: "added", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	want := fmt.Sprintf("more than %d entries", federate.MaxListEntries)
	testenv.Eventually(t, waitLong, "the refused listing to be logged", func() bool {
		return strings.Contains(gwlog.String(), want)
	})
	// Each refused listing read one page past the bound; one more listing
	// may be under way (the client's session heard list_changed too).
	n, per := e.pages.Load(), int64(federate.MaxListEntries/e.perPage+1)
	if listings := int64(strings.Count(gwlog.String(), want)) + 1; n > listings*per {
		t.Errorf("%d pages read, want at most %d a listing", n, per)
	}
	var tools []string
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, tool.Name)
	}
	if !slices.Equal(tools, []string{"e__keep"}) {
		t.Errorf("tools after a listing past the bound: %.200v, want the previous listing", tools)
	}
	if got, isErr := callText(t, cs, "e__keep", nil); got != "kept" || isErr {
		t.Errorf("e__keep after a listing past the bound = %q (isError %v)", got, isErr)
	}
}
