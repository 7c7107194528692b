package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/gateway"
	"github.com/mcpgate/mcpgate/policy"
)

// retireDelay is how long an authenticator a reload replaced stays open:
// requests that loaded the old config just before the swap may still
// verify with it.
const retireDelay = 10 * time.Second

// errStopping refuses a reload that comes while serve returns.
var errStopping = errors.New("mcpgate is stopping")

// reloader reloads serve's config file into its gateway (SIGHUP, POST
// /admin/reload). It owns the authenticators: the one in force and those
// reloads replaced, all closed by close, so that none of their goroutines
// (a JWKS refresh) outlives serve.
type reloader struct {
	path string
	log  *slog.Logger
	g    *gateway.Gateway // set before the first reload

	mu      sync.Mutex // held by reload and close
	current *auth.Authenticator
	cfg     *policy.Config
	closed  bool
	retired sync.WaitGroup // the goroutines of retire
	stop    chan struct{}  // closed by close: retired ones close at once
}

func newReloader(path string, cfg *policy.Config, a *auth.Authenticator, log *slog.Logger) *reloader {
	return &reloader{path: path, log: log, current: a, cfg: cfg, stop: make(chan struct{})}
}

// reload loads the config file and applies it; on any error the config in
// force stays.
func (r *reloader) reload(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("reload refused: %w", errStopping)
	}
	cfg, err := policy.Load(r.path)
	if err != nil {
		return fmt.Errorf("reload refused, the old config stays in force:\n%w", err)
	}
	na, kept := r.current, keepsAuth(r.cfg, cfg)
	if !kept {
		if na, err = buildAuth(ctx, cfg, r.log); err != nil {
			return fmt.Errorf("reload refused, the old config stays in force: %w", err)
		}
	}
	if err := r.g.Apply(cfg, na); err != nil {
		if !kept {
			na.Close()
		}
		return fmt.Errorf("reload refused, the old config stays in force: %w", err)
	}
	r.g.SetAdminToken(adminToken(cfg, r.log))
	if !kept {
		r.retire(r.current)
	}
	r.current, r.cfg = na, cfg
	logConfigNotes(r.log, cfg)
	r.log.Info("config reloaded", "config", r.path)
	return nil
}

// retire closes old after retireDelay, or at close if that comes first.
func (r *reloader) retire(old *auth.Authenticator) {
	r.retired.Add(1)
	go func() {
		defer r.retired.Done()
		t := time.NewTimer(retireDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.stop:
		}
		old.Close()
	}()
}

// close closes every authenticator, the one in force and the retired ones,
// and waits for them; reloads are refused after.
func (r *reloader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	close(r.stop)
	r.retired.Wait()
	r.current.Close()
}
