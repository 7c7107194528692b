package gosdk_test

// End-to-end harness: a go-sdk MCP server with the middleware, served over
// Streamable HTTP behind gosdk.RequireBearerToken, its engine built through
// package setup on the in-process store or a real redis-server
// (internal/testenv), and go-sdk clients over HTTP with a bearer token.
// Tool handlers count the calls that reach them.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/gosdk"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
	"github.com/mcpgate/mcpgate/usage"
)

const (
	testSecret    = "gosdk-test-secret-0123456789abcdef" // >= 32 bytes
	testSecretEnv = "MCPGATE_GOSDK_TEST_SECRET"
)

// The secret is set once for the package: t.Setenv cannot be used by
// parallel tests.
func TestMain(m *testing.M) {
	os.Setenv(testSecretEnv, testSecret)
	os.Exit(m.Run())
}

// storeModes are the stores every scenario runs on.
var storeModes = []struct {
	name  string
	redis bool
}{{"memory", false}, {"redis", true}}

// server is a running go-sdk server with the middleware.
type server struct {
	t      *testing.T
	url    string
	engine *enforce.Engine
	stores *setup.Stores
	cfg    *policy.Config
	redis  *testenv.Redis // nil on the in-process store

	mu    sync.Mutex
	calls map[string]*atomic.Int64 // tool → calls that reached its handler
	// release, when set, is what the slow tool waits for (else its ms);
	// see setRelease.
	release chan struct{}
	started chan struct{} // told each time the slow tool starts
}

// options of newServer.
type options struct {
	// usage, when set, meters into an SQLite file in t.TempDir().
	usage bool
	// noSending builds the server as if no gosdk.SendingMiddleware were
	// installed in the process.
	noSending bool
	// pageSize is the server's tools/list page size (0: the SDK's).
	pageSize int
	// stateless serves with the SDK's stateless handler.
	stateless bool
	// settled, when set, is told how each admitted tools/call ended.
	settled func(tool string, st enforce.Status)
	// settling, when set, is the middleware's Options.Settling.
	settling *gosdk.Settling
}

// newServer starts a server whose config is an auth section, the store
// section of the mode (store.redis on a new redis-server when redis) and
// yaml.
func newServer(t *testing.T, redis bool, yaml string, o options) *server {
	t.Helper()
	s := &server{t: t, calls: map[string]*atomic.Int64{}, started: make(chan struct{}, 64)}
	text := "auth:\n  jwt:\n    hs256_secret_env: " + testSecretEnv + "\n"
	if redis {
		s.redis = testenv.StartRedis(t, nil)
		text += "store:\n  redis: \"" + s.redis.URL + "\"\n  timeout: 2s\n  on_error: closed\n"
	}
	text += "usage:\n  store: sqlite:" + filepath.Join(t.TempDir(), "usage.db") + "\n  flush_interval: 1h\n"
	text += "cache:\n  timeout: 2s\n" // the default 25ms is within reach of a loaded machine under -race
	text += yaml
	cfg, err := policy.ParseEmbedded("gosdk_test.yaml", []byte(text))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", text, err)
	}
	s.cfg = cfg
	ctx := context.Background()
	log := quietLogger()
	a, err := setup.Auth(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	st, err := setup.Open(ctx, cfg, log, &setup.Options{NoUsage: !o.usage})
	if err != nil {
		t.Fatal(err)
	}
	s.stores = st
	t.Cleanup(func() { _ = st.Close() })
	eng, err := enforce.New(st.EngineOptions())
	if err != nil {
		t.Fatal(err)
	}
	s.engine = eng
	t.Cleanup(func() { _ = eng.Close() }) // before the stores close (cleanups run last first)

	srv := mcp.NewServer(&mcp.Implementation{Name: "gosdk-test", Version: "1"}, &mcp.ServerOptions{PageSize: o.pageSize})
	s.addTools(srv)
	switch {
	case o.noSending:
		srv.AddReceivingMiddleware(gosdk.ScopeMiddleware(nil), gosdk.MiddlewareWithoutSending(eng, nil))
	case o.settled != nil:
		srv.AddReceivingMiddleware(gosdk.ScopeMiddleware(nil), gosdk.MiddlewareSettling(eng, nil, o.settled))
		srv.AddSendingMiddleware(gosdk.SendingMiddleware())
	default:
		srv.AddReceivingMiddleware(gosdk.ScopeMiddleware(nil), gosdk.Middleware(eng, &gosdk.Options{Settling: o.settling}))
		srv.AddSendingMiddleware(gosdk.SendingMiddleware())
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: o.stateless})
	hs := httptest.NewServer(gosdk.RequireBearerToken(a, cfg)(gosdk.CancelAbandoned(h)))
	t.Cleanup(hs.Close)
	s.url = hs.URL
	return s
}

// toolServer is a go-sdk server with the middleware (as in the README: scopes,
// limits, sending middleware, CancelAbandoned, RequireBearerToken) whose
// tools add registers.
type toolServer struct {
	url    string
	engine *enforce.Engine
	stores *setup.Stores
}

func newToolServer(t *testing.T, yaml string, add func(*mcp.Server)) *toolServer {
	return newToolServerOpts(t, yaml, add, nil, nil)
}

func newToolServerOpts(t *testing.T, yaml string, add func(*mcp.Server), hopts *mcp.StreamableHTTPOptions, sopts *mcp.ServerOptions) *toolServer {
	t.Helper()
	return newToolServerWith(t, yaml, add, hopts, sopts, nil)
}

// newToolServerWith is newToolServerOpts whose engine options engine, when
// not nil, adjusts.
func newToolServerWith(t *testing.T, yaml string, add func(*mcp.Server), hopts *mcp.StreamableHTTPOptions, sopts *mcp.ServerOptions, engine func(*enforce.Options)) *toolServer {
	t.Helper()
	text := "auth:\n  jwt:\n    hs256_secret_env: " + testSecretEnv + "\n" +
		"usage:\n  store: sqlite:" + t.TempDir() + "/usage.db\n  flush_interval: 1h\n" + yaml
	cfg, err := policy.ParseEmbedded("gosdk_test.yaml", []byte(text))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", text, err)
	}
	ctx := context.Background()
	a, err := setup.Auth(ctx, cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	st, err := setup.Open(ctx, cfg, quietLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	eopts := st.EngineOptions()
	if engine != nil {
		engine(&eopts)
	}
	eng, err := enforce.New(eopts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	srv := mcp.NewServer(&mcp.Implementation{Name: "gosdk-test", Version: "1"}, sopts)
	add(srv)
	srv.AddReceivingMiddleware(gosdk.ScopeMiddleware(nil), gosdk.Middleware(eng, nil))
	srv.AddSendingMiddleware(gosdk.SendingMiddleware())
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, hopts)
	hs := httptest.NewServer(gosdk.RequireBearerToken(a, cfg)(gosdk.CancelAbandoned(h)))
	t.Cleanup(hs.Close)
	return &toolServer{url: hs.URL, engine: eng, stores: st}
}

func (s *toolServer) connect(t *testing.T, tok string) *mcp.ClientSession {
	t.Helper()
	cs, err := connectTo(s.url, tok)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

type textIn struct {
	Text string `json:"text"`
}

type lookupOut struct {
	Found string `json:"found"`
}

type slowIn struct {
	Key string `json:"key,omitempty"`
	MS  int    `json:"ms,omitempty"`
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// addTools adds the test tools:
//
//	echo {text}  returns text
//	fail {}      returns a tool error (isError)
//	relay {text} returns, on its first call, the denial (deny_as: result) of
//	             an mcpgate-protected upstream it relays; then text
//	slow {key, ms} waits for s.release (or ms), then returns "slow <key>"
//	llm {}       returns a result reporting _meta.usage.tokens 7
//	lookup {text} returns {"found": text}, and declares that outputSchema
//	ask {text}   asks its client for input (elicitation), returns "asked: <its answer>"
func (s *server) addTools(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, _ textIn) (*mcp.CallToolResult, any, error) {
		s.count("ask")
		r, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "your answer?"})
		if err != nil {
			return nil, nil, err
		}
		answer, _ := r.Content["answer"].(string)
		return text("asked: " + answer), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "lookup"}, func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, lookupOut, error) {
		s.count("lookup")
		return nil, lookupOut{Found: in.Text}, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
		s.count("echo")
		return text(in.Text), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "relay"}, func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
		if s.counter("relay").Add(1) == 1 {
			return &mcp.CallToolResult{
				Content: []mcp.Content{&mcp.TextContent{Text: "rate limit per_tenant exceeded; retry in 30s"}},
				IsError: true,
				Meta:    mcp.Meta{enforce.MetaDenial: map[string]any{"rule": "per_tenant", "retryAfter": 30}},
			}, nil, nil
		}
		return text(in.Text), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "fail"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		s.count("fail")
		return nil, nil, errors.New("the tool failed")
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "slow"}, func(ctx context.Context, _ *mcp.CallToolRequest, in slowIn) (*mcp.CallToolResult, any, error) {
		s.count("slow")
		s.started <- struct{}{}
		wait := s.releaser()
		var timer <-chan time.Time
		if wait == nil {
			timer = time.After(time.Duration(in.MS) * time.Millisecond)
		}
		select {
		case <-wait:
		case <-timer:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return text("slow " + in.Key), nil, nil
	})
	// slowllm waits like slow, then reports _meta.usage.tokens 7.
	mcp.AddTool(srv, &mcp.Tool{Name: "slowllm"}, func(ctx context.Context, _ *mcp.CallToolRequest, in slowIn) (*mcp.CallToolResult, any, error) {
		s.count("slowllm")
		s.started <- struct{}{}
		select {
		case <-s.releaser():
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		r := text("completion " + in.Key)
		r.Meta = mcp.Meta{"usage": map[string]any{"tokens": 7}}
		return r, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "llm"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		s.count("llm")
		r := text("completion")
		r.Meta = mcp.Meta{"usage": map[string]any{"tokens": 7}}
		return r, nil, nil
	})
}

// setRelease sets what the slow tool waits for: nil, its ms.
func (s *server) setRelease(c chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.release = c
}

func (s *server) releaser() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.release
}

func (s *server) count(tool string) {
	s.counter(tool).Add(1)
}

func (s *server) counter(tool string) *atomic.Int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls[tool]
	if c == nil {
		c = new(atomic.Int64)
		s.calls[tool] = c
	}
	return c
}

// reached is how many calls of tool reached its handler.
func (s *server) reached(tool string) int64 { return s.counter(tool).Load() }

// claims are a valid token's: tenant, subject, scope, an hour to live.
func claims(tenant, sub, scope string) map[string]any {
	now := time.Now()
	return map[string]any{"tenant_id": tenant, "sub": sub, "scope": scope, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

func sign(t testing.TB, c map[string]any) string {
	t.Helper()
	tok, err := auth.SignHS256([]byte(testSecret), c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// token is a valid token of tenant's sub with every tool in scope.
func token(t testing.TB, tenant, sub string) string {
	return sign(t, claims(tenant, sub, "tools:*"))
}

// bearer adds "Authorization: Bearer <token>", as an agent's client does.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens a go-sdk client session to the server with tok.
func (s *server) connect(tok string) *mcp.ClientSession {
	s.t.Helper()
	cs, err := connectTo(s.url, tok)
	if err != nil {
		s.t.Fatalf("connect: %v", err)
	}
	s.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// connectAnswering opens a client session to the server with tok whose
// client accepts every elicitation with {"answer": answer}.
func (s *server) connectAnswering(tok, answer string) *mcp.ClientSession {
	s.t.Helper()
	cs, err := connectWith(s.url, tok, answering(func() string { return answer }))
	if err != nil {
		s.t.Fatalf("connect: %v", err)
	}
	s.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// answering is the options of a client that accepts every elicitation
// with {"answer": answer()}.
func answering(answer func() string) *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": answer()}}, nil
		}}
}

// connectTo opens a client session to url with tok; the transport does not
// retry (a retried POST would blur exact counts).
func connectTo(url, tok string) (*mcp.ClientSession, error) {
	return connectWith(url, tok, nil)
}

func connectWith(url, tok string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "gosdk-test-client", Version: "1"}, opts)
	tr := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{tok}}, MaxRetries: -1}
	return client.Connect(ctx, tr, nil)
}

func call(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (*mcp.CallToolResult, error) {
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
}

// rpcError is err's JSON-RPC error; nil when it has none.
func rpcError(err error) *jsonrpc.Error {
	var e *jsonrpc.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// denial decodes a -33029 error's data; the test fails on another error.
func denial(t *testing.T, err error) enforce.Denial {
	t.Helper()
	e := rpcError(err)
	if e == nil || e.Code != enforce.CodeRateLimited {
		t.Fatalf("err = %v, want a JSON-RPC error with code %d", err, enforce.CodeRateLimited)
	}
	var d enforce.Denial
	if err := decodeStrict(e.Data, &d); err != nil {
		t.Fatalf("error data %s: %v", e.Data, err)
	}
	return d
}

// resultText is the text of a result's first content.
func resultText(r *mcp.CallToolResult) string {
	if r == nil || len(r.Content) == 0 {
		return ""
	}
	if tc, ok := r.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return fmt.Sprintf("%T", r.Content[0])
}

// durable is tenant's usage in the current period as the durable store
// holds it.
func (s *server) durable(tenant string) usage.Record {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, _, err := s.stores.Usage.Get(ctx, tenant, usage.Period(time.Now()))
	if err != nil {
		s.t.Fatal(err)
	}
	return rec
}

// quietLogger drops Info and below; set MCPGATE_TEST_LOG to see everything.
func quietLogger() *slog.Logger {
	if os.Getenv("MCPGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// hasAll reports whether s contains every one of subs.
func hasAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Shared with the other packages' tests (internal/testenv).
var run = testenv.Run
