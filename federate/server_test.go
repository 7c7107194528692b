//lint:file-ignore SA1019 the test upstream samples and logs, deprecated in MCP 2026-07-28 but still served; the federation relays them.
package federate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"
)

// stdioEnv makes the test binary a stdio MCP server (testServer) named by
// its value: the stdio upstream of these tests is a go-sdk server built by
// the test, run by the Federator as it runs any command.
const stdioEnv = "FEDERATE_TEST_STDIO_SERVER"

// rawEnv makes the test binary a bare stdio JSON-RPC server whose
// initialize result has no capabilities at all (as some servers answer).
const rawEnv = "FEDERATE_TEST_RAW_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(rawEnv) != "" {
		serveRaw()
		os.Exit(0)
	}
	if os.Getenv(wedgeEnv) != "" {
		serveWedged()
		os.Exit(0)
	}
	if os.Getenv(chattyEnv) != "" {
		serveChatty()
		os.Exit(0)
	}
	if os.Getenv(tenantEnv) != "" {
		if err := newTenantServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "stdio server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if name := os.Getenv(stdioEnv); name != "" {
		srv := newTestServer(name, nil)
		if err := srv.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "stdio server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every Federator is closed by its test: no goroutine of it (session
	// watchers, supervisors, relays) may outlive the tests.
	goleak.VerifyTestMain(m)
}

// stdioCommand is the command of a stdio upstream named name.
func stdioCommand(t *testing.T) []string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, "-test.run=^$"}
}

// counter counts the calls that reached a test server, by tool.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) add(tool string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[tool]++
	c.mu.Unlock()
}

func (c *counter) get(tool string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[tool]
}

type textArgs struct {
	Text  string `json:"text,omitempty"`
	MS    int    `json:"ms,omitempty"`
	Count int    `json:"count,omitempty"`
}

// newTestServer is an upstream whose answers name it: tools echo, sample
// (asks its client for a completion), notify (logs and reports progress),
// slow (sleeps ms, reporting progress every 50ms when asked), burst (three
// progress notifications right before its answer), flood (count progress
// notifications of 32 KiB each, then creates the file text), env (the value
// of the environment variable text), crash (exits: for stdio); a prompt
// greet; a resource test://<name>/info and a template
// test://<name>/items/{id}.
func newTestServer(name string, calls *counter) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		calls.add("echo")
		return text(name + ": " + a.Text), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "sample"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		calls.add("sample")
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: a.Text}}}})
		if err != nil {
			return nil, nil, err
		}
		return text(name + " sampled: " + res.Content.(*mcp.TextContent).Text), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "notify"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		calls.add("notify")
		_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: name + " says " + a.Text})
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: name})
		}
		return text("notified"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "slow"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		calls.add("slow")
		tok := req.Params.GetProgressToken()
		end := time.Now().Add(time.Duration(a.MS) * time.Millisecond)
		for i := 0; time.Now().Before(end); i++ {
			select {
			case <-ctx.Done():
				calls.add("slow-cancelled")
				return nil, nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			if tok != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i)})
			}
		}
		return text("slept"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "burst"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		calls.add("burst")
		// Three progress notifications and the answer at once: the
		// notifications must still reach the client first.
		if tok := req.Params.GetProgressToken(); tok != nil {
			for i := 1; i <= 3; i++ {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: 3})
			}
		}
		return text("burst"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "flood"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		calls.add("flood")
		msg := strings.Repeat("x", 32<<10)
		if tok := req.Params.GetProgressToken(); tok != nil {
			for i := range a.Count {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Message: msg})
			}
		}
		if err := os.WriteFile(a.Text, nil, 0o600); err != nil {
			return nil, nil, err
		}
		return text("flooded"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "roots"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		res, err := req.Session.ListRoots(ctx, nil)
		if err != nil {
			return nil, nil, err
		}
		var uris []string
		for _, r := range res.Roots {
			uris = append(uris, r.URI)
		}
		return text(name + " roots: " + strings.Join(uris, ",")), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "env"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		return text(os.Getenv(a.Text)), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "crash"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		os.Exit(3)
		return nil, nil, nil
	})
	s.AddPrompt(&mcp.Prompt{Name: "greet"}, func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "hello from " + name}}}}, nil
	})
	s.AddResource(&mcp.Resource{URI: "test://" + name + "/info", Name: name + "-info"}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "info of " + name}}}, nil
	})
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://" + name + "/items/{id}", Name: name + "-items"}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item of " + name}}}, nil
	})
	return s
}

// rawServer is a bare Streamable HTTP MCP server, for what an SDK server
// would not send: initialize opens a session (name, capabilities as given),
// notifications are accepted, a GET is refused (405), a DELETE answered
// 200, and every other request gets answer's JSON result ({} for ""), or
// nothing more when answer wrote the response itself (handled).
func rawServer(name, capabilities string, answer func(w http.ResponseWriter, id json.RawMessage, method string) (result string, handled bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			if r.Method == http.MethodGet {
				w.WriteHeader(http.StatusMethodNotAllowed)
			}
			return
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		body, _ := io.ReadAll(r.Body)
		if json.Unmarshal(body, &m) != nil || m.ID == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		result := ""
		if m.Method == "initialize" {
			w.Header().Set("Mcp-Session-Id", name+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
			result = `{"protocolVersion":"2025-11-25","serverInfo":{"name":"` + name + `","version":"1"},"capabilities":` + capabilities + `}`
		} else {
			var handled bool
			if result, handled = answer(w, m.ID, m.Method); handled {
				return
			}
		}
		if result == "" {
			result = `{}`
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, m.ID, result)
	})
}

// httpUpstream serves a test server over Streamable HTTP on a loopback port
// that survives restarts (stop, then start again on the same address).
type httpUpstream struct {
	t     *testing.T
	name  string
	calls *counter
	addr  string
	wrap  func(http.Handler) http.Handler
	// build makes the server each start serves (nil: newTestServer).
	build func() *mcp.Server
	mu    sync.Mutex
	srv   *httptest.Server
	mcp   *mcp.Server
}

func startHTTPUpstream(t *testing.T, name string, wrap func(http.Handler) http.Handler) *httpUpstream {
	u := &httpUpstream{t: t, name: name, calls: &counter{}, wrap: wrap}
	u.start()
	t.Cleanup(u.stop)
	return u
}

func (u *httpUpstream) URL() string { return "http://" + u.addr + "/mcp" }

// server is the server the upstream serves now (nil while stopped).
func (u *httpUpstream) server() *mcp.Server {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mcp
}

func (u *httpUpstream) start() {
	var srv *mcp.Server
	if u.build != nil {
		srv = u.build()
	} else {
		srv = newTestServer(u.name, u.calls)
	}
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	if u.wrap != nil {
		h = u.wrap(h)
	}
	ts := httptest.NewUnstartedServer(h)
	if u.addr != "" {
		ln, err := listenRetry(u.addr)
		if err != nil {
			u.t.Fatal(err)
		}
		ts.Listener.Close()
		ts.Listener = ln
	}
	ts.Start()
	u.mu.Lock()
	u.srv, u.mcp, u.addr = ts, srv, ts.Listener.Addr().String()
	u.mu.Unlock()
}

// stop kills the server: listener and every connection.
func (u *httpUpstream) stop() {
	u.mu.Lock()
	ts, srv := u.srv, u.mcp
	u.srv, u.mcp = nil, nil
	u.mu.Unlock()
	if ts != nil {
		ts.CloseClientConnections()
		ts.Close()
		for ss := range srv.Sessions() { // a dead server keeps no session
			_ = ss.Close()
		}
	}
}

func listenRetry(addr string) (net.Listener, error) {
	var err error
	for range 50 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

// serveRaw answers initialize without capabilities and ping; it ignores
// everything else.
func serveRaw() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(sc.Bytes(), &m) != nil || m.ID == nil {
			continue
		}
		result := `{}`
		if m.Method == "initialize" {
			result = `{"protocolVersion":"2025-11-25","serverInfo":{"name":"raw","version":"1"}}`
		}
		fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":%s}`+"\n", m.ID, result)
	}
}

// serveSDK serves srv over Streamable HTTP until the test ends, then closes
// its connections and sessions (a server keeps its sessions' goroutines
// otherwise), and returns its URL.
func serveSDK(t *testing.T, srv *mcp.Server) string {
	t.Helper()
	return serveSDKWith(t, srv, nil)
}

// serveSDKWith is serveSDK with the handler's options.
func serveSDKWith(t *testing.T, srv *mcp.Server, opts *mcp.StreamableHTTPOptions) string {
	t.Helper()
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, opts))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	})
	return ts.URL
}
