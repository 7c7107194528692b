package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/gosdk"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// shutdownGrace is how long a stopping server waits for calls in flight.
const shutdownGrace = 15 * time.Second

// run parses args, serves until ctx ends, then shuts down gracefully.
// ready, when set, is told the bound address.
func run(ctx context.Context, args []string, stderr io.Writer, ready func(addr string)) error {
	fs := flag.NewFlagSet("sdkserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "mcpgate config file (required; upstream may be absent)")
	listen := fs.String("listen", "", "address to serve on (default: the config's listen)")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if *path == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("--config FILE is required, and nothing else")
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l}))
	cfg, err := policy.LoadEmbedded(*path)
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	addr := *listen
	if addr == "" {
		addr = cfg.Listen
	}
	s, err := newServer(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer s.close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return s.serve(ctx, ln, ready)
}

// server is the example MCP server with what it owns.
type server struct {
	log    *slog.Logger
	auth   *auth.Authenticator
	stores *setup.Stores
	engine *enforce.Engine
	mcp    *mcp.Server
	// settling counts the calls the middleware has not settled yet: a
	// shutdown waits for them before the engine closes.
	settling gosdk.Settling
	// idle ends a session its client stopped using without a DELETE (it
	// crashed, or exited): sessions.idle_timeout; an open GET stream is
	// use (listenersKept), as the gateway counts it.
	idle   time.Duration
	served atomic.Int64 // tool calls that reached a tool
	// endStreams ends the server-initiated streams (GET) when a shutdown
	// starts: they never go idle, and the shutdown waits for calls only.
	streams    context.Context
	endStreams context.CancelFunc
}

// newServer builds the authenticator, the stores, the engine and the MCP
// server of cfg.
func newServer(ctx context.Context, cfg *policy.Config, log *slog.Logger) (_ *server, err error) {
	s := &server{log: log, idle: cfg.Sessions.IdleTimeout}
	s.streams, s.endStreams = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.auth, err = setup.Auth(ctx, cfg, log); err != nil {
		return nil, err
	}
	if s.stores, err = setup.Open(ctx, cfg, log, nil); err != nil {
		return nil, err
	}
	if s.engine, err = enforce.New(s.stores.EngineOptions()); err != nil {
		return nil, err
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "mcpgate-sdkserver", Version: "1"}, nil)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "echo", Description: "Returns the text."}, s.echo)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "count", Description: "Returns how many tool calls this process has served."}, s.count)
	// Scopes first: a call outside them is refused before it is charged.
	s.mcp.AddReceivingMiddleware(gosdk.ScopeMiddleware(nil), gosdk.Middleware(s.engine, &gosdk.Options{Settling: &s.settling}))
	// A shared cache must see a handler ask its client something (none of
	// these tools does, but a config may share their cache).
	s.mcp.AddSendingMiddleware(gosdk.SendingMiddleware())
	return s, nil
}

type echoIn struct {
	Text string `json:"text" jsonschema:"the text to return"`
}

func (s *server) echo(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
	s.served.Add(1)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
}

func (s *server) count(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
	n := s.served.Add(1)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strconv.FormatInt(n, 10)}}}, nil, nil
}

// handler serves MCP (Streamable HTTP) at /mcp, behind bearer-token auth.
func (s *server) handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{SessionTimeout: s.idle})
	mux := http.NewServeMux()
	// CancelAbandoned: a call whose client went away frees its slot at once.
	mux.Handle("/mcp", gosdk.RequireBearerToken(s.auth, s.engine.Config())(s.endingStreams(s.listenersKept(gosdk.CancelAbandoned(h)))))
	return mux
}

// listenersKept keeps the session of a client listening on its GET stream
// alive: the SDK's SessionTimeout counts POSTs only, and would end, after
// idle, the session of a client that only waits for notifications (as
// the gateway, which counts an open stream as use, does not). While the
// stream is open, an in-process ping (gosdk.KeepAlive) is posted in the
// session every idle/2.
func (s *server) listenersKept(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.Header.Get("Mcp-Session-Id") == "" || s.idle <= 0 {
			h.ServeHTTP(w, r)
			return
		}
		ctx, stop := context.WithCancel(r.Context())
		defer stop()
		go func() {
			t := time.NewTicker(s.idle / 2)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					// The server's own ping: not charged to the tenant.
					if err := gosdk.KeepAlive(ctx, h, r); err != nil {
						s.log.Debug("keep-alive ping", "err", err)
						return
					}
				}
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// endingStreams ends a GET (the server's stream to the client) when a
// shutdown starts.
func (s *server) endingStreams(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			defer context.AfterFunc(s.streams, cancel)()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	})
}

// serve serves on ln until ctx ends, then waits up to shutdownGrace for
// the calls in flight, and for the calls answered but not yet settled (a
// call whose client left while its handler, or its cached load, runs on):
// they are settled, on the cost they report, before the engine closes.
func (s *server) serve(ctx context.Context, ln net.Listener, ready func(addr string)) error {
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	srv.RegisterOnShutdown(s.endStreams)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("sdkserver listening", "addr", ln.Addr().String(), "mcp", "http://"+ln.Addr().String()+"/mcp")
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		// The listener failed: the calls already admitted still run. Stop
		// as on ctx's end, so that they settle before the engine closes,
		// then report the failure.
		s.log.Error("serving failed: stopping, waiting for calls in flight", "err", err, "grace", shutdownGrace)
		s.stop(srv)
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down: waiting for calls in flight", "grace", shutdownGrace)
	s.stop(srv)
	return nil
}

// stop shuts srv down: it waits, up to shutdownGrace in all, for the calls
// in flight and then for the calls answered but not yet settled, then cuts
// the connections left.
func (s *server) stop(srv *http.Server) {
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		s.log.Warn("calls still in flight after the shutdown grace: stopping without them", "err", err)
		_ = srv.Close()
	}
	if err := s.settling.Wait(sctx); err != nil {
		s.log.Warn("calls still running after the shutdown grace: their usage is flushed as estimated", "err", err)
	}
}

// close stops the engine (its final usage flush), then closes the stores
// and the authenticator.
func (s *server) close() {
	s.endStreams()
	if s.engine != nil {
		if err := s.engine.Close(); err != nil {
			s.log.Warn("closing the engine", "err", err)
		}
	}
	if s.stores != nil {
		if err := s.stores.Close(); err != nil {
			s.log.Warn("closing the stores", "err", err)
		}
	}
	if s.auth != nil {
		_ = s.auth.Close()
	}
}
