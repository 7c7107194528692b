package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lestrrat-go/httprc/v3"
	"github.com/lestrrat-go/httprc/v3/errsink"
	"github.com/lestrrat-go/jwx/v3/jwk"

	"github.com/mcpgate/mcpgate/internal/redact"
)

const (
	// DefaultJWKSRefresh is the default Options.JWKSRefresh.
	DefaultJWKSRefresh = 15 * time.Minute
	// MissRefreshInterval is the least time between two refreshes of the
	// JWKS URL caused by tokens with an unknown kid: a flood of forged kids
	// costs the identity provider at most one request per interval.
	MissRefreshInterval = 10 * time.Second
	// maxJWKSInterval bounds how long a Cache-Control header can stretch the
	// periodic refresh, which bounds how long a key removed from the JWKS
	// (a revoked key) stays trusted.
	maxJWKSInterval = time.Hour
	// jwksStartTimeout bounds the first fetch in New when the context has no
	// earlier deadline.
	jwksStartTimeout = 30 * time.Second
	// defaultHTTPTimeout is the timeout of the client used when
	// Options.HTTPClient is nil.
	defaultHTTPTimeout = 10 * time.Second
	// missRefreshTimeout bounds how long the verifications waiting for a
	// miss refresh wait, whatever Options.HTTPClient's own timeout (none,
	// perhaps).
	missRefreshTimeout = 30 * time.Second
)

// errRedirectToHTTP means the JWKS URL, or a redirect it led to, was https
// and redirected to plain http: keys fetched in cleartext are keys anyone on
// the path can swap, and the operator who wrote https did not ask for that.
var errRedirectToHTTP = errors.New("JWKS redirect from https to plain http refused")

// maxJWKSRedirects is how many redirects a fetch of the key set follows
// (net/http's default policy, which checkRedirect replaces).
const maxJWKSRedirects = 10

// errRefreshLimited means an unknown kid was seen within MissRefreshInterval
// of the previous refresh, so the key set was not fetched again.
var errRefreshLimited = errors.New("key set refreshed less than " + MissRefreshInterval.String() + " ago")

// remoteKeys is a JWKS fetched from a URL through jwk.Cache, which refreshes
// it in the background. A token whose kid is not in the cached set triggers
// one synchronous refresh, rate-limited to one per MissRefreshInterval.
type remoteKeys struct {
	url    string
	logURL string // origin and path: no userinfo or query, for logs and errors
	// urlForms are the ways errors write url (see redact.Forms), which
	// redact replaces with logURL.
	urlForms []string
	cache    *jwk.Cache
	res      *httprc.ResourceBase[jwk.Set]
	log      *slog.Logger
	now      func() time.Time
	// ctx is the miss refreshes' context: they serve every verification
	// waiting for them, not the one that started them. Canceled by close.
	ctx    context.Context
	cancel context.CancelFunc

	ix      atomic.Pointer[keyIndex]
	mu      sync.Mutex
	running *missRefresh // the miss refresh under way, nil when none; guarded by mu
	last    time.Time    // start of the last miss refresh; guarded by mu
	closed  atomic.Bool
}

// missRefresh is one refresh of the key set for tokens with an unknown
// kid; done is closed when it ended, with err its error.
type missRefresh struct {
	done chan struct{}
	err  error
}

// newRemoteKeys checks opts.JWKSURL and fetches its key set once: it fails
// when that fetch fails or brings no usable key. ctx bounds the fetch (with
// jwksStartTimeout when it has no earlier deadline); later refreshes run
// until close.
func newRemoteKeys(ctx context.Context, opts *Options, log *slog.Logger, now func() time.Time) (*remoteKeys, error) {
	u, err := url.Parse(opts.JWKSURL)
	if err != nil {
		// url.Parse's error repeats the URL, credentials and all.
		return nil, errors.New("auth: JWKS URL does not parse: want an absolute http(s) URL")
	}
	logURL := logForm(u)
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("auth: JWKS URL %q: want an absolute http(s) URL", logURL)
	}
	r := &remoteKeys{
		url:      opts.JWKSURL,
		logURL:   logURL,
		urlForms: redact.Forms(opts.JWKSURL, u),
		log:      log,
		now:      now,
	}
	if u.Scheme == "http" && !isLoopback(u.Hostname()) {
		log.Warn("auth: JWKS URL is plain http; anyone on the path can swap the keys", "url", r.logURL)
	}
	if err := r.start(ctx, r.registerOptions(opts)); err != nil {
		return nil, err
	}
	return r, nil
}

// logForm is u as logs and errors may show it: scheme, host and path, no
// userinfo or query (where credentials go).
func logForm(u *url.URL) string {
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}

// registerOptions returns how the cache fetches the key set: with
// opts.HTTPClient (else one with defaultHTTPTimeout), every opts.JWKSRefresh
// (else DefaultJWKSRefresh) or, when Cache-Control allows, less often, up
// to maxJWKSInterval. A client without a redirect policy of its own gets
// checkRedirect's (on a copy: the caller's client is left as it is).
func (r *remoteKeys) registerOptions(opts *Options) []jwk.RegisterOption {
	var hc *http.Client
	if opts.HTTPClient == nil {
		hc = &http.Client{Timeout: defaultHTTPTimeout}
	} else {
		c := *opts.HTTPClient
		hc = &c
	}
	if hc.CheckRedirect == nil {
		hc.CheckRedirect = r.checkRedirect
	}
	refresh := opts.JWKSRefresh
	if refresh <= 0 {
		refresh = DefaultJWKSRefresh
	}
	return []jwk.RegisterOption{
		jwk.WithHTTPClient(hc),
		jwk.WithMinInterval(refresh),
		jwk.WithMaxInterval(max(refresh, maxJWKSInterval)),
		// The identity provider owns this set: keep the keys we understand
		// when it publishes one we do not (a new key type, for example).
		jwk.WithIgnoreParseError(true),
	}
}

// start creates r's cache, registers r.url with reg and waits, within ctx,
// for the first fetch; then it checks that the set holds a usable key. When
// start fails, the cache is shut down. A refresh that fails after start is
// logged, and the previous key set kept.
func (r *remoteKeys) start(ctx context.Context, reg []jwk.RegisterOption) error {
	// The first fetch runs in httprc's worker and reports failure only to the
	// error sink, so the sink cancels the start-up wait with the cause: New
	// fails at once with the real reason instead of waiting out its deadline.
	startCtx, cancelStart := context.WithCancelCause(ctx)
	defer cancelStart(nil)
	var started atomic.Bool
	sink := errsink.NewFunc(func(_ context.Context, err error) {
		if !started.Load() {
			cancelStart(err)
			return
		}
		r.log.Warn("auth: JWKS refresh failed; keeping the previous key set", "url", r.logURL, "err", r.redact(err))
	})

	// The cache outlives New's ctx (often a start-up deadline); Close stops it.
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	cache, err := jwk.NewCache(r.ctx, httprc.NewClient(httprc.WithWorkers(1), httprc.WithErrorSink(sink)))
	if err != nil {
		r.cancel()
		return fmt.Errorf("auth: starting JWKS cache: %w", err)
	}
	r.cache = cache
	if err := r.register(startCtx, reg); err != nil {
		return r.abortStart(ctx, err)
	}
	started.Store(true)
	if err := r.load(ctx); err != nil {
		return r.abortStart(ctx, err)
	}
	return nil
}

// register registers r.url with the cache and waits for its first fetch,
// at most jwksStartTimeout. The error is the reason the error sink gave
// when it cut the wait short, else the wait's own.
func (r *remoteKeys) register(startCtx context.Context, reg []jwk.RegisterOption) error {
	waitCtx, cancelWait := context.WithTimeout(startCtx, jwksStartTimeout)
	defer cancelWait()
	if err := r.cache.Register(waitCtx, r.url, reg...); err != nil {
		cause := context.Cause(waitCtx)
		if cause == nil {
			cause = err
		}
		return fmt.Errorf("auth: fetching JWKS %s: %w", r.logURL, r.redact(cause))
	}
	return nil
}

// load takes the fetched set from the cache and fails when it holds no key
// r can verify with, naming the keys skipped and why.
func (r *remoteKeys) load(ctx context.Context) error {
	res, err := r.cache.LookupResource(ctx, r.url)
	if err != nil {
		return fmt.Errorf("auth: JWKS %s: %w", r.logURL, r.redact(err))
	}
	r.res = res
	ix := r.index()
	if len(ix.all) == 0 {
		return fmt.Errorf("auth: JWKS %s holds no usable signing key (%s)", r.logURL, ix.reasons())
	}
	return nil
}

// abortStart shuts the cache down after start failed with err, and returns
// err. The shutdown gets its own few seconds: ctx may be what ran out.
func (r *remoteKeys) abortStart(ctx context.Context, err error) error {
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = r.cache.Shutdown(shutdownCtx)
	r.cancel()
	return err
}

// redact returns err with every form of r's URL in its text (see
// redact.Forms) replaced by r.logURL; the result unwraps to err. The errors
// of httprc and net/http repeat the URL, and they reach the log of every
// refused token, the refresh log and New's error: a credential in the URL
// would go with them.
//
// A refused redirect's error (see checkRedirect) also repeats the Location
// the server sent, which may carry a credential of its own: it is cut to
// its logForm too.
func (r *remoteKeys) redact(err error) error {
	var ue *url.Error
	if errors.Is(err, errRedirectToHTTP) && errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			err = redact.Replace(err, redact.Forms(ue.URL, u), logForm(u))
		}
	}
	return redact.Replace(err, r.urlForms, r.logURL)
}

// checkRedirect is the redirect policy of the client fetching the key set:
// net/http's (at most maxJWKSRedirects redirects), except that a redirect
// from https to plain http is refused, and one to another host is logged.
// The identity provider chose https; a redirect that drops it would fetch
// the keys in cleartext, which nothing else would warn about (the "plain
// http" warning looks at the configured URL only).
func (r *remoteKeys) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxJWKSRedirects {
		return fmt.Errorf("stopped after %d redirects", maxJWKSRedirects)
	}
	prev := via[len(via)-1].URL
	if strings.EqualFold(prev.Scheme, "https") && !strings.EqualFold(req.URL.Scheme, "https") {
		return fmt.Errorf("%w: from %s to %s", errRedirectToHTTP, logForm(prev), logForm(req.URL))
	}
	if !strings.EqualFold(prev.Hostname(), req.URL.Hostname()) {
		r.log.Warn("auth: JWKS URL redirected to another host; the keys come from a server the configuration does not name",
			"url", r.logURL, "from", logForm(prev), "to", logForm(req.URL))
	}
	return nil
}

func isLoopback(host string) bool {
	return host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1"
}

// index returns the key index of the set currently cached, rebuilding it when
// the cache holds a new set. Keys are converted once per set, not per token.
func (r *remoteKeys) index() *keyIndex {
	set := r.res.Resource()
	cur := r.ix.Load()
	if cur != nil && cur.set == set {
		return cur
	}
	if set == nil {
		return &keyIndex{}
	}
	ix := newKeyIndex(set)
	kept := len(ix.all) == 0 && cur != nil && len(cur.all) > 0
	if kept {
		// A set with no usable key ({"keys":[]}, keys of types we skip) is
		// an identity provider's glitch far more often than a revocation
		// of every key: rejecting every token until the next good set
		// would take the gateway down with it. The keys in use stay,
		// against this set (so it is looked at once).
		ix = &keyIndex{set: set, all: cur.all, byKID: cur.byKID, skipped: ix.skipped, private: ix.private}
	}
	if r.ix.CompareAndSwap(cur, ix) {
		for _, err := range ix.private {
			r.log.Error("auth: JWKS URL publishes a private key; it is skipped, but anyone who fetched the set can sign tokens with it: have the identity provider rotate it", "url", r.logURL, "reason", err.Error())
		}
		for _, s := range ix.skipped {
			r.log.Warn("auth: JWKS key skipped", "url", r.logURL, "reason", s)
		}
		if kept {
			r.log.Warn("auth: JWKS refresh brought no usable key; keeping the previous keys", "url", r.logURL, "keys", len(ix.all))
		}
		r.log.Debug("auth: JWKS loaded", "url", r.logURL, "keys", len(ix.all))
	}
	return ix
}

func (r *remoteKeys) candidates(ctx context.Context, kid string) ([]keyEntry, error) {
	ix := r.index()
	if es, ok := ix.find(kid); ok {
		return es, nil
	}
	if kid == "" {
		// A refresh cannot help a token that names no key.
		return nil, ix.missError(kid)
	}
	// Look again even when this call did not refresh: a concurrent refresh
	// (or the background one) may have brought the key.
	refreshErr := r.refreshOnMiss(ctx)
	ix = r.index()
	if es, ok := ix.find(kid); ok {
		return es, nil
	}
	if refreshErr != nil {
		return nil, fmt.Errorf("%w (%v)", ix.missError(kid), refreshErr)
	}
	return nil, fmt.Errorf("%w, even after refreshing the key set", ix.missError(kid))
}

// refreshOnMiss fetches the key set again unless a refresh started less than
// MissRefreshInterval ago. Callers that arrive while a refresh runs wait for
// it (at most until ctx ends) and use its result: however slow the identity
// provider, a caller waits for one refresh, not for its turn in a queue of
// them.
func (r *remoteKeys) refreshOnMiss(ctx context.Context) error {
	if r.closed.Load() {
		return errors.New("authenticator closed")
	}
	r.mu.Lock()
	f := r.running
	if f == nil {
		now := r.now()
		if !r.last.IsZero() && now.Sub(r.last) < MissRefreshInterval {
			r.mu.Unlock()
			return errRefreshLimited
		}
		r.last = now
		f = &missRefresh{done: make(chan struct{})}
		r.running = f
		go r.refresh(f)
	}
	r.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// refresh runs the miss refresh f, within missRefreshTimeout, and ends it.
func (r *remoteKeys) refresh(f *missRefresh) {
	ctx, cancel := context.WithTimeout(r.ctx, missRefreshTimeout)
	defer cancel()
	if _, err := r.cache.Refresh(ctx, r.url); err != nil {
		f.err = fmt.Errorf("refreshing JWKS %s: %w", r.logURL, r.redact(err))
	}
	r.mu.Lock()
	r.running = nil
	r.mu.Unlock()
	close(f.done)
}

func (r *remoteKeys) close(ctx context.Context) error {
	if r.closed.Swap(true) {
		return nil
	}
	r.cancel()
	return r.cache.Shutdown(ctx)
}
