package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type mode struct {
	name      string
	opts      Options
	protocol  string // ClientSessionOptions.ProtocolVersion; "" = SDK default
	wantProto string
}

var modes = []mode{
	{"sse-sessions", Options{}, "", "2025-11-25"},
	{"json-sessions", Options{JSONResponse: true}, "", "2025-11-25"},
	{"sse-stateless", Options{Stateless: true}, "", "2026-07-28"},
	{"json-stateless", Options{Stateless: true, JSONResponse: true}, "", "2026-07-28"},
	{"sse-sessions-2025-06-18", Options{}, "2025-06-18", "2025-06-18"},
}

func connect(t *testing.T, srv *Server, m mode, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: m.protocol})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != m.wantProto {
		t.Errorf("negotiated protocol %s, want %s", got, m.wantProto)
	}
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func textOf(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("content %v", res.Content)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content %T", res.Content[0])
	}
	return tc.Text
}

func TestTools(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			srv := New(&m.opts)
			cs := connect(t, srv, m, nil)
			ctx := context.Background()

			tools, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tool := range tools.Tools {
				names = append(names, tool.Name)
			}
			slices.Sort(names)
			want := slices.Sorted(slices.Values(ToolNames))
			if !slices.Equal(names, want) {
				t.Fatalf("tools %v, want %v", names, want)
			}

			if got := textOf(t, call(t, cs, "echo", map[string]any{"text": "hello"})); got != "hello" {
				t.Errorf("echo = %q", got)
			}

			res := call(t, cs, "search", map[string]any{"query": "Red Shoes", "limit": 2})
			var out searchOut
			b, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(b, &out); err != nil || len(out.Results) != 2 || out.Results[1].URL != "https://example.com/red-shoes/2" {
				t.Errorf("search = %s (%v)", b, err)
			}
			again := call(t, cs, "search", map[string]any{"limit": 2, "query": "Red Shoes"})
			b2, _ := json.Marshal(again.StructuredContent)
			if string(b) != string(b2) {
				t.Errorf("search is not deterministic: %s vs %s", b, b2)
			}

			if got := textOf(t, call(t, cs, "slow", map[string]any{"ms": 20})); got != "done after 20ms" {
				t.Errorf("slow = %q", got)
			}

			res = call(t, cs, "fail", nil)
			if !res.IsError || textOf(t, res) == "" {
				t.Errorf("fail: isError=%v content=%v", res.IsError, res.Content)
			}

			res = call(t, cs, "llm_complete", map[string]any{"prompt": "hi", "tokens": 42})
			usage, _ := res.Meta["usage"].(map[string]any)
			if usage == nil || usage["tokens"] != float64(42) {
				t.Errorf("llm_complete _meta = %v", res.Meta)
			}
			res = call(t, cs, "llm_complete", map[string]any{"prompt": strings.Repeat("x", 40)})
			if usage, _ := res.Meta["usage"].(map[string]any); usage["tokens"] != float64(11) {
				t.Errorf("llm_complete default tokens _meta = %v", res.Meta)
			}

			if got := textOf(t, call(t, cs, "update_product", map[string]any{"id": "p-1"})); got != "product p-1 updated" {
				t.Errorf("update_product = %q", got)
			}

			// A call to an unknown tool still reached the server: counted.
			_, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: "nope"})

			wantCalls := map[string]int64{"echo": 1, "search": 2, "slow": 1, "fail": 1, "llm_complete": 2, "update_product": 1, "nope": 1}
			var total int64
			for tool, n := range wantCalls {
				if got := srv.Calls(tool); got != n {
					t.Errorf("Calls(%s) = %d, want %d", tool, got, n)
				}
				total += n
			}
			if got := srv.TotalCalls(); got != total {
				t.Errorf("TotalCalls = %d, want %d", got, total)
			}
			if got := srv.Requests("tools/list"); got != 1 {
				t.Errorf("Requests(tools/list) = %d", got)
			}
		})
	}
}

func TestSlowHonoursCancellation(t *testing.T) {
	for _, m := range []mode{modes[0], modes[2]} { // sessions (notifications/cancelled) and stateless (request end)
		t.Run(m.name, func(t *testing.T) {
			srv := New(&m.opts)
			cs := connect(t, srv, m, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"ms": 10000}})
			if err == nil {
				t.Fatal("slow call returned no error after its context ended")
			}
			deadline := time.Now().Add(5 * time.Second)
			for srv.Cancelled() != 1 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if srv.Cancelled() != 1 {
				t.Fatalf("Cancelled = %d: the tool kept running", srv.Cancelled())
			}
			if time.Since(start) > 5*time.Second {
				t.Fatal("cancellation took too long")
			}
		})
	}
}

func TestSlowReportsProgress(t *testing.T) {
	var mu sync.Mutex
	var progress []float64
	srv := New(nil)
	cs := connect(t, srv, modes[0], &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, req.Params.Progress)
			mu.Unlock()
		},
	})
	params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"ms": 40}}
	params.SetProgressToken("tok")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(progress, []float64{1, 2, 3}) {
		t.Fatalf("progress %v", progress)
	}
}

func TestOnRequestSeesHeaders(t *testing.T) {
	var mu sync.Mutex
	var methods []string
	srv := New(&Options{OnRequest: func(r *http.Request) {
		mu.Lock()
		methods = append(methods, r.Method+" "+r.Header.Get("Mcp-Method"))
		mu.Unlock()
	}, Stateless: true})
	cs := connect(t, srv, modes[2], nil)
	call(t, cs, "echo", map[string]any{"text": "x"})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(methods, "POST tools/call") {
		t.Fatalf("requests seen: %v", methods)
	}
}

func TestConcurrentCallsCounted(t *testing.T) {
	srv := New(&Options{Stateless: true, JSONResponse: true})
	cs := connect(t, srv, modes[3], nil)
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": fmt.Sprint(i)}})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if srv.Calls("echo") != n || srv.TotalCalls() != n {
		t.Fatalf("Calls(echo) = %d, TotalCalls = %d, want %d", srv.Calls("echo"), srv.TotalCalls(), n)
	}
}
