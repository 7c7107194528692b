// Package upstream is a demo MCP tool server built with the official Go SDK.
// It is the upstream of `mcpgate demo` and of every end-to-end test: it
// serves Streamable HTTP (SSE or JSON answers, with or without sessions) and
// counts the calls that reach it, so a test can assert exactly what the
// gateway let through.
//
// Tools:
//
//	echo            {text}            returns text
//	search          {query, limit?}   returns deterministic fake results
//	slow            {ms}              sleeps ms milliseconds, honouring cancellation
//	                                  (and reporting progress when asked)
//	fail            {message?}        returns a tool error (isError: true)
//	llm_complete    {prompt, tokens?} returns a completion whose result carries
//	                                  _meta.usage.tokens (tokens, or ~len(prompt)/4)
//	update_product  {id, price?}      pretends to update a product
//
// Resources (ResourceURIs, and the templates ResourceTemplates) and prompts
// (PromptNames) are served too, for the gateway's resource and prompt scopes.
package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Options configures a demo upstream. A nil *Options means the zero value:
// SSE answers, stateful sessions.
type Options struct {
	// JSONResponse makes POST answers application/json instead of
	// text/event-stream.
	JSONResponse bool
	// Stateless disables sessions: no Mcp-Session-Id, GET and DELETE are
	// refused with 405. MCP 2026-07-28 clients need it; older clients work
	// either way.
	Stateless bool
	// Name is the server name reported to clients; "" means
	// "mcpgate-demo-upstream".
	Name string
	// SessionTimeout closes sessions idle this long; zero means 30 minutes,
	// negative never.
	SessionTimeout time.Duration
	// OnRequest, when set, sees every HTTP request before the SDK handles it
	// (tests record the headers that reached the upstream). It must not read
	// the body.
	OnRequest func(*http.Request)
	// Logger receives the SDK's logs; nil discards them.
	Logger *slog.Logger
}

// Server is a demo MCP server. Its methods are safe for concurrent use.
type Server struct {
	sdk     *mcp.Server
	handler http.Handler

	total     atomic.Int64
	cancelled atomic.Int64
	mu        sync.Mutex
	calls     map[string]int64 // tools/call by tool name
	methods   map[string]int64 // requests and notifications by method
}

// ToolNames lists the demo tools, in documentation order.
var ToolNames = []string{"echo", "search", "slow", "fail", "llm_complete", "update_product"}

// New returns a demo server ready to serve.
func New(opts *Options) *Server {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Name == "" {
		o.Name = "mcpgate-demo-upstream"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.SessionTimeout == 0:
		o.SessionTimeout = 30 * time.Minute
	case o.SessionTimeout < 0:
		o.SessionTimeout = 0
	}
	s := &Server{calls: map[string]int64{}, methods: map[string]int64{}}
	s.sdk = mcp.NewServer(&mcp.Implementation{Name: o.Name, Version: "1.0.0"}, &mcp.ServerOptions{Logger: o.Logger})
	s.sdk.AddReceivingMiddleware(s.count)
	s.addTools()
	s.addResources()
	s.addPrompts()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.sdk }, &mcp.StreamableHTTPOptions{
		JSONResponse:   o.JSONResponse,
		Stateless:      o.Stateless,
		SessionTimeout: o.SessionTimeout,
		Logger:         o.Logger,
		// A 2026-07-28 client's POST is the whole call: let its end cancel
		// the tool, as `slow` expects.
		PropagateRequestCancellation: true,
	})
	if o.OnRequest != nil {
		s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			o.OnRequest(r)
			h.ServeHTTP(w, r)
		})
	} else {
		s.handler = h
	}
	return s
}

// Handler returns the Streamable HTTP handler (POST, GET, DELETE), to mount
// at the MCP endpoint, e.g. /mcp.
func (s *Server) Handler() http.Handler { return s.handler }

// MCPServer returns the underlying SDK server, e.g. to connect it over
// another transport.
func (s *Server) MCPServer() *mcp.Server { return s.sdk }

// Calls returns how many tools/call requests named tool reached the server
// (including calls that failed validation).
func (s *Server) Calls(tool string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[tool]
}

// TotalCalls returns how many tools/call requests reached the server.
func (s *Server) TotalCalls() int64 { return s.total.Load() }

// Requests returns how many messages with method reached the server, e.g.
// "tools/list" or "initialize".
func (s *Server) Requests(method string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.methods[method]
}

// Cancelled returns how many slow calls stopped early because their context
// was cancelled.
func (s *Server) Cancelled() int64 { return s.cancelled.Load() }

// count is a receiving middleware: every message that reaches the server
// passes through it once, whatever its outcome.
func (s *Server) count(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		s.mu.Lock()
		s.methods[method]++
		if method == "tools/call" {
			name := ""
			if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok && p != nil {
				name = p.Name
			}
			s.calls[name]++
			s.total.Add(1)
		}
		s.mu.Unlock()
		return next(ctx, method, req)
	}
}

type echoIn struct {
	Text string `json:"text" jsonschema:"the text to echo back"`
}

type searchIn struct {
	Query string `json:"query" jsonschema:"what to search for"`
	Limit int    `json:"limit,omitempty" jsonschema:"how many results (default 3, at most 10)"`
}

type searchHit struct {
	Title string `json:"title"`
	URL   string `json:"url"`
	Score int    `json:"score"`
}

type searchOut struct {
	Query   string      `json:"query"`
	Results []searchHit `json:"results"`
}

type slowIn struct {
	MS int `json:"ms" jsonschema:"how long to work, in milliseconds"`
}

type failIn struct {
	Message string `json:"message,omitempty" jsonschema:"the error message"`
}

type completeIn struct {
	Prompt string `json:"prompt" jsonschema:"the prompt"`
	Tokens int    `json:"tokens,omitempty" jsonschema:"tokens to report as used (default about len(prompt)/4)"`
}

type productIn struct {
	ID    string  `json:"id" jsonschema:"the product id"`
	Price float64 `json:"price,omitempty" jsonschema:"the new price"`
}

func text(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }

func (s *Server) addTools() {
	mcp.AddTool(s.sdk, &mcp.Tool{Name: "echo", Description: "Returns its text."},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: text(in.Text)}, nil, nil
		})

	mcp.AddTool(s.sdk, &mcp.Tool{Name: "search", Description: "Searches a fake index (deterministic results)."},
		func(_ context.Context, _ *mcp.CallToolRequest, in searchIn) (*mcp.CallToolResult, searchOut, error) {
			n := in.Limit
			if n <= 0 {
				n = 3
			}
			n = min(n, 10)
			out := searchOut{Query: in.Query, Results: make([]searchHit, n)}
			slug := strings.Join(strings.Fields(strings.ToLower(in.Query)), "-")
			for i := range out.Results {
				out.Results[i] = searchHit{
					Title: fmt.Sprintf("Result %d for %q", i+1, in.Query),
					URL:   fmt.Sprintf("https://example.com/%s/%d", slug, i+1),
					Score: 100 - 10*i,
				}
			}
			return nil, out, nil
		})

	mcp.AddTool(s.sdk, &mcp.Tool{Name: "slow", Description: "Works for ms milliseconds; honours cancellation and reports progress when given a progress token."},
		func(ctx context.Context, req *mcp.CallToolRequest, in slowIn) (*mcp.CallToolResult, any, error) {
			d := time.Duration(max(in.MS, 0)) * time.Millisecond
			token := req.Params.GetProgressToken()
			const steps = 4
			for i := 1; i <= steps; i++ {
				t := time.NewTimer(d / steps)
				select {
				case <-ctx.Done():
					t.Stop()
					s.cancelled.Add(1)
					return nil, nil, ctx.Err()
				case <-t.C:
				}
				if token != nil && i < steps {
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: token, Progress: float64(i), Total: steps,
						Message: fmt.Sprintf("step %d of %d", i, steps),
					})
				}
			}
			return &mcp.CallToolResult{Content: text(fmt.Sprintf("done after %dms", in.MS))}, nil, nil
		})

	mcp.AddTool(s.sdk, &mcp.Tool{Name: "fail", Description: "Always fails with a tool error (isError: true)."},
		func(_ context.Context, _ *mcp.CallToolRequest, in failIn) (*mcp.CallToolResult, any, error) {
			msg := in.Message
			if msg == "" {
				msg = "the fail tool failed, as it always does"
			}
			return &mcp.CallToolResult{IsError: true, Content: text(msg)}, nil, nil
		})

	mcp.AddTool(s.sdk, &mcp.Tool{Name: "llm_complete", Description: "Fake LLM completion; reports _meta.usage.tokens."},
		func(_ context.Context, _ *mcp.CallToolRequest, in completeIn) (*mcp.CallToolResult, any, error) {
			tokens := in.Tokens
			if tokens <= 0 {
				tokens = len(in.Prompt)/4 + 1
			}
			return &mcp.CallToolResult{
				Meta:    mcp.Meta{"usage": map[string]any{"tokens": tokens}},
				Content: text("completion of: " + in.Prompt),
			}, nil, nil
		})

	mcp.AddTool(s.sdk, &mcp.Tool{Name: "update_product", Description: "Pretends to update a product (a write, never cacheable)."},
		func(_ context.Context, _ *mcp.CallToolRequest, in productIn) (*mcp.CallToolResult, any, error) {
			if in.ID == "" {
				return &mcp.CallToolResult{IsError: true, Content: text("id is required")}, nil, nil
			}
			return &mcp.CallToolResult{Content: text(fmt.Sprintf("product %s updated", in.ID))}, nil, nil
		})
}
