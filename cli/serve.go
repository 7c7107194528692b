package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/gateway"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// shutdownGrace is how long a stopping gateway waits for calls in flight.
const shutdownGrace = 15 * time.Second

func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	path := fs.String("config", "", "config file (required)")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "mcpgate serve: --config FILE is required")
		return errUsage
	}
	// Catch SIGHUP from the start: its default action would kill a gateway
	// that is still connecting to its stores. Reloads wait until serving.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// SIGINT and SIGTERM too: their default action would kill mcpgate
	// mid-start and orphan a stdio upstream (a process group of its own).
	// A stop during the start ends the steps that take ctx, then closes
	// what was started.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, err := newLogger(stderr, *level)
	if err != nil {
		fmt.Fprintln(stderr, "mcpgate serve:", err)
		return errUsage
	}
	cfg, err := policy.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	shutdownTracing, err := setupTracing(ctx, log)
	if err != nil {
		return startFailed(ctx, log, err)
	}
	defer shutdownTracing()
	a, err := buildAuth(ctx, cfg, log)
	if err != nil {
		return startFailed(ctx, log, err)
	}
	r := newReloader(*path, cfg, a, log)
	defer r.close()
	g, cleanup, err := newGateway(ctx, cfg, a, r.reload, log, false)
	if err != nil {
		return startFailed(ctx, log, err)
	}
	defer cleanup()
	r.g = g
	if ctx.Err() != nil {
		// Stopped during the start, past what gateway.New cuts short
		// (its upstreams' start): stop them, and the rest, now.
		log.Info("stopped during the start")
		return g.Close()
	}
	return serveUntilDone(ctx, g, cfg.Listen, log, hup, r.reload, nil)
}

// startFailed is the error of serve's start failing with err: none when a
// stop (a signal, ctx's end) came first, since err is then likely its
// consequence (a fetch cut short) and the stop was asked for.
func startFailed(ctx context.Context, log *slog.Logger, err error) error {
	if ctx.Err() == nil {
		return err
	}
	log.Info("stopped during the start", "err", err)
	return nil
}

// newGateway builds the stores (see setup.Open) and the gateway for cfg. An
// SQLite usage store creates its schema itself; a DynamoDB one must exist
// (mcpgate usage init), unless initUsage is set (the demo creates its own).
// The gateway's Close flushes usage; closing the stores is left to the
// caller through the returned func.
func newGateway(ctx context.Context, cfg *policy.Config, a *auth.Authenticator, reload func(context.Context) error, log *slog.Logger, initUsage bool) (*gateway.Gateway, func(), error) {
	logConfigNotes(log, cfg)
	key, err := sessionKey(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	st, err := setup.Open(ctx, cfg, log, &setup.Options{CreateUsage: initUsage})
	if err != nil {
		return nil, nil, err
	}
	opts := gateway.Options{Config: cfg, Auth: a, Reload: reload, Logger: log, SessionKey: key,
		Usage: st.Usage, SharedStore: st.Shared, Probe: st.Probe, Cache: st.Cache,
		TracerProvider: metrics.TracerProvider()}
	opts.AdminToken = adminToken(cfg, log)
	g, err := gateway.New(ctx, opts)
	if err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	return g, func() { _ = st.Close() }, nil
}

func logConfigNotes(log *slog.Logger, cfg *policy.Config) {
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
}

// serveUntilDone serves g on addr until ctx ends or SIGINT/SIGTERM arrives;
// a signal on hup calls reload (nil: no reloads). ready, when set, is told
// the bound address.
func serveUntilDone(ctx context.Context, g *gateway.Gateway, addr string, log *slog.Logger, hup <-chan os.Signal, reload func(context.Context) error, ready func(addr string)) error {
	defer g.Close()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// server.* timeouts and the connection cap (see gateway.HTTPServer).
	srv := g.HTTPServer(slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	ln = g.Listener(ln)
	// Server-initiated streams (GET) never go idle: end them when the
	// shutdown starts, so that it waits for calls only.
	srv.RegisterOnShutdown(g.EndStreams)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("mcpgate listening", "addr", ln.Addr().String())
	if ready != nil {
		ready(ln.Addr().String())
	}

	for {
		select {
		case <-hup:
			// SIGHUP is also log rotation's signal: reopen the audit file
			// first, whether or not the config reloads.
			_ = g.ReopenAudit(ctx) // a failure is logged; the old file stays
			if err := reload(ctx); err != nil {
				log.Error("SIGHUP reload failed", "err", err)
			}
		case err := <-errc:
			// The listener failed (Serve does not retry such an error):
			// the calls already admitted still run. Stop as on a signal,
			// so that the final flush (g.Close) sees their cost
			// corrections, then report the failure.
			log.Error("serving failed: stopping, waiting for calls in flight", "err", err, "grace", shutdownGrace)
			_ = stopServing(srv, log)
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
			log.Info("shutting down: waiting for calls in flight", "grace", shutdownGrace)
			return stopServing(srv, log)
		}
	}
}

// stopServing shuts srv down: it waits up to shutdownGrace for the calls in
// flight, so that the final flush that follows counts what they settle,
// then cuts the connections left.
func stopServing(srv *http.Server, log *slog.Logger) error {
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// The final flush (g.Close) runs with these calls still going: a
		// cost correction they make after it stays in the live counter
		// (for another instance's sweep) or is lost with the in-process
		// store.
		log.Warn("calls still in flight after the shutdown grace: stopping without them", "grace", shutdownGrace)
		_ = srv.Close()
		return nil
	}
	return err
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// sessionKey is the key binding MCP session ids to callers: the variable
// auth.session_secret_env names, else derived from the HS256 secret (which
// every instance shares), else nil (a random key per process).
func sessionKey(cfg *policy.Config, log *slog.Logger) ([]byte, error) {
	if env := cfg.Auth.SessionSecretEnv; env != "" {
		v := os.Getenv(env)
		if v == "" {
			return nil, fmt.Errorf("auth.session_secret_env: environment variable %s is not set or empty", env)
		}
		return []byte(v), nil
	}
	if env := cfg.Auth.JWT.HS256SecretEnv; env != "" && os.Getenv(env) != "" {
		return gateway.DeriveSessionKey([]byte(os.Getenv(env))), nil
	}
	log.Warn("MCP session ids are bound with a random per-process key: with several instances, set auth.session_secret_env so that any instance accepts any session")
	return nil, nil
}
