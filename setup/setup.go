// Package setup builds, from a loaded configuration, what an enforcement
// engine (package enforce) needs: the authenticator of the auth section, the
// shared limit store of store.redis with its probe, the durable usage store
// of usage.store and the result cache of cache.redis. The mcpgate command,
// the load generator and examples/sdkserver all build these the same way,
// through this package:
//
//	a, err := setup.Auth(ctx, cfg, log)
//	...
//	st, err := setup.Open(ctx, cfg, log, nil)
//	...
//	defer st.Close()         // after the engine's Close (its final usage flush)
//	eng, err := enforce.New(st.EngineOptions())
//
// Every function validates what it builds and returns an error naming the
// config field at fault; none of them exits or panics.
package setup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/dynamodb"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// ErrSecretUnset means the variable auth.jwt.hs256_secret_env names is
// unset or empty in this process's environment.
var ErrSecretUnset = errors.New("not set or empty")

// AuthOptions maps the auth section of cfg to auth.Options, reading the
// HS256 secret from the environment variable auth.jwt.hs256_secret_env
// names (an error when it is unset or empty). log receives the
// authenticator's own logs (nil: slog.Default()).
func AuthOptions(cfg *policy.Config, log *slog.Logger) (auth.Options, error) {
	j := cfg.Auth.JWT
	opts := auth.Options{
		PublicKeyFile:  j.PublicKeyFile,
		JWKSFile:       j.JWKSFile,
		JWKSURL:        j.JWKSURL,
		Issuer:         j.Issuer,
		Audience:       j.Audience,
		Resource:       cfg.Auth.Resource,
		TenantClaim:    j.TenantClaim,
		TierClaim:      j.TierClaim,
		ScopeClaim:     j.ScopeClaim,
		DefaultTier:    cfg.DefaultTier,
		RequireExpiry:  j.RequireExpiry,
		RequireSubject: j.RequireSubject,
		Leeway:         AuthLeeway(j.Leeway),
		Logger:         log,
	}
	if j.HS256SecretEnv != "" {
		secret := os.Getenv(j.HS256SecretEnv)
		if secret == "" {
			return opts, fmt.Errorf("auth.jwt.hs256_secret_env: environment variable %s is %w", j.HS256SecretEnv, ErrSecretUnset)
		}
		opts.HS256Secret = []byte(secret)
	}
	return opts, nil
}

// AuthLeeway maps auth.jwt.leeway, where 0s means no leeway (the config
// fills in its default), to auth.Options.Leeway, where 0 means auth's
// default and a negative value means none.
func AuthLeeway(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// Auth builds the authenticator of cfg's auth section (see AuthOptions).
// With a JWKS URL it fetches the key set before returning; ctx bounds that
// fetch. Close it when done.
func Auth(ctx context.Context, cfg *policy.Config, log *slog.Logger) (*auth.Authenticator, error) {
	opts, err := AuthOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	return auth.New(ctx, opts) // its errors say "auth: " already
}

// CheckAuth reports what would make Auth fail on cfg without touching the
// network: an unset secret variable, a key file that is missing or holds no
// usable key, a bad option. A JWKS URL is not fetched (mcpgate check runs
// where the identity provider may not be reachable): only serve finds out
// whether it answers.
func CheckAuth(ctx context.Context, cfg *policy.Config) error {
	opts, err := AuthOptions(cfg, slog.New(slog.DiscardHandler))
	if err != nil || opts.JWKSURL != "" {
		return err
	}
	a, err := auth.New(ctx, opts)
	if err != nil {
		return err
	}
	return a.Close()
}

// Options tunes Open. A nil *Options means the zero value: the usage store
// of usage.store is opened and must be ready.
type Options struct {
	// CreateUsage creates the usage store's table when it does not exist
	// (a DynamoDB table: the demo's own store). Without it a DynamoDB table
	// must exist (mcpgate usage init); an SQLite file gets its schema on
	// open either way.
	CreateUsage bool
	// NoUsage opens no usage store: Stores.Usage is nil, and an engine
	// built on it meters nothing and enforces no quota.
	NoUsage bool
}

// Stores are the stores an engine runs on. Close them after the engine
// (whose Close flushes usage a last time into Usage).
type Stores struct {
	// Shared is the limit store of store.redis; nil without it (counters
	// then live in the engine's in-process store).
	Shared limit.GuardedStore
	// Probe checks that Shared answers (a PING); nil without Shared.
	Probe func(ctx context.Context) error
	// Usage is the durable usage store of usage.store; nil with
	// Options.NoUsage.
	Usage usage.Store
	// Cache is the result cache: on cache.redis, else on store.redis, else
	// in process.
	Cache *cache.Cache

	cfg         *policy.Config
	log         *slog.Logger
	sharedConn  rueidis.Client    // nil without store.redis
	sharedStore *redisstore.Store // Shared, to close
	cacheClient rueidis.Client    // nil unless cache.redis is set
}

// Open opens the stores cfg names, in this order: the usage store
// (usage.store: an SQLite file gets its schema created or upgraded, a
// DynamoDB table must exist unless opts.CreateUsage), the shared limit
// store (store.redis, with a warning when its maxmemory-policy can evict
// counters) and the result cache (cache.redis, else the store's Redis,
// else in process). log receives the warnings (nil: slog.Default()). What
// was opened before a failure is closed again.
func Open(ctx context.Context, cfg *policy.Config, log *slog.Logger, opts *Options) (*Stores, error) {
	if cfg == nil {
		return nil, errors.New("setup: a config is required")
	}
	if log == nil {
		log = slog.Default()
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	s := &Stores{cfg: cfg, log: log}
	if !o.NoUsage {
		us, err := OpenServeUsage(ctx, cfg, o.CreateUsage, log)
		if err != nil {
			return nil, err
		}
		s.Usage = us
	}
	if err := s.openShared(ctx, cfg); err != nil {
		_ = s.Close()
		return nil, err
	}
	if err := s.openCache(ctx, cfg); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// ErrRedisDownAtStart is why Open fails when store.redis or cache.redis
// cannot be connected to: the Redis client dials when it is created, so a
// Redis must answer when mcpgate starts. Once it runs, a Redis down only
// degrades (store.on_error, calls served uncached).
var ErrRedisDownAtStart = errors.New("a Redis must answer when mcpgate starts (store.on_error and the uncached fallback apply only once it runs)")

// libraryLoadTimeout bounds the start's load of the limit store's library.
const libraryLoadTimeout = 5 * time.Second

// openShared connects to store.redis, when the config names one.
func (s *Stores) openShared(ctx context.Context, cfg *policy.Config) error {
	if len(cfg.Store.Redis) == 0 {
		return nil
	}
	opt, err := redisstore.ClientOption(cfg.Store.Redis...)
	if err != nil {
		return fmt.Errorf("store.redis: %w", err)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return fmt.Errorf("store.redis: cannot connect: %w: %w", err, ErrRedisDownAtStart)
	}
	st, err := redisstore.New(client, &redisstore.Options{Timeout: cfg.Store.Timeout, Logger: s.log})
	if err != nil {
		client.Close()
		return err
	}
	s.sharedConn, s.sharedStore, s.Shared = client, st, st
	s.Probe = st.Ping
	// The first call would load the library within store.timeout (25ms by
	// default), which a cold connection on a busy host can exceed: load it
	// now. A Redis that accepted the connection but is slow to answer is no
	// reason to refuse to start (store.on_error says what calls get
	// meanwhile); one that refuses the connection is (NewClient above
	// dials at once: ErrRedisDownAtStart).
	lctx, cancel := context.WithTimeout(ctx, libraryLoadTimeout)
	if err := st.Load(lctx); err != nil {
		s.log.Warn("store.redis: the limit library is loaded on the first call instead", "err", err)
	}
	cancel()
	CheckEviction(ctx, s.log, client, cache.RoleStore, "store.redis")
	return nil
}

// openCache builds the result cache: on cache.redis, else on the shared
// store's Redis, else in process.
func (s *Stores) openCache(ctx context.Context, cfg *policy.Config) error {
	var (
		store cache.Store
		err   error
	)
	switch {
	case len(cfg.Cache.Redis) > 0:
		opt, oerr := redisstore.ClientOption(cfg.Cache.Redis...)
		if oerr != nil {
			return fmt.Errorf("cache.redis: %w", oerr)
		}
		if s.cacheClient, oerr = rueidis.NewClient(opt); oerr != nil {
			return fmt.Errorf("cache.redis: cannot connect: %w: %w", oerr, ErrRedisDownAtStart)
		}
		CheckEviction(ctx, s.log, s.cacheClient, cache.RoleCache, "cache.redis")
		store, err = cache.NewRedisStore(s.cacheClient, nil)
	case s.sharedConn != nil:
		CheckEviction(ctx, s.log, s.sharedConn, cache.RoleCache, "store.redis (used by the cache)")
		store, err = cache.NewRedisStore(s.sharedConn, nil)
	default:
		store, err = cache.NewMemoryStore(&cache.MemoryOptions{MaxEntries: cfg.Cache.MaxEntries, MaxBytes: cfg.Cache.MaxBytes})
	}
	if err == nil {
		// The start's bound is the default of loads given none (Warm, at
		// start); a call's load is bounded by the config in force
		// (enforce.Ticket.CachePlan), which a reload may change.
		load := enforce.CacheLoadTimeout(cfg)
		opts := &cache.Options{Logger: s.log, Timeout: cfg.Cache.Timeout, LoadTimeout: load, LockTTL: load}
		if s.Cache, err = cache.New(store, opts); err == nil {
			return nil
		}
	}
	return fmt.Errorf("cache: %w", err)
}

// EngineOptions are the options of an engine on these stores: Config,
// Logger, Shared, Probe, Usage and Cache filled; the caller may set the
// others (Metrics, Tracer, OnBreakerOpened, ...) before enforce.New.
func (s *Stores) EngineOptions() enforce.Options {
	o := enforce.Options{Config: s.cfg, Logger: s.log, Cache: s.Cache}
	if s.Shared != nil {
		o.Shared, o.Probe = s.Shared, s.Probe
	}
	if s.Usage != nil {
		o.Usage = s.Usage
	}
	return o
}

// Close closes the stores (and their Redis clients). Close the engine
// running on them first: its final flush writes to Usage.
func (s *Stores) Close() error {
	var err error
	if s.Cache != nil {
		err = s.Cache.Close()
	}
	if s.cacheClient != nil {
		s.cacheClient.Close()
	}
	if s.Usage != nil {
		err = errors.Join(err, s.Usage.Close())
	}
	if s.sharedStore != nil {
		s.sharedStore.Close()
	}
	if s.sharedConn != nil {
		s.sharedConn.Close()
	}
	return err
}

// CheckEviction warns once, on log, about a maxmemory-policy of client that
// can evict rate-limit counters (role cache.RoleStore) or make cache writes
// fail (cache.RoleCache); what names the Redis in the warning. A server
// that refuses CONFIG GET (ElastiCache) is said so once. It waits at most
// two seconds.
func CheckEviction(ctx context.Context, log *slog.Logger, client rueidis.Client, role cache.Role, what string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	pol, warning, err := cache.CheckEviction(ctx, client, role)
	switch {
	case err != nil:
		log.Warn("cannot read maxmemory-policy", "redis", what, "err", err)
	case warning != "":
		log.Warn(warning, "redis", what, "maxmemory_policy", pol)
	}
}

// usageOpenTimeout bounds the opening of the usage store: an SQLite
// migration waiting for another process's lock, or a DynamoDB endpoint
// that does not answer.
const usageOpenTimeout = 30 * time.Second

// OpenServeUsage opens the usage store of cfg for a server that meters
// (mcpgate serve, an engine in process): an SQLite file gets its schema
// created or upgraded on open (logged on log); a DynamoDB table must exist
// (mcpgate usage init), unless create is set. The store is checked ready
// before it is returned; opening waits at most 30 seconds.
func OpenServeUsage(ctx context.Context, cfg *policy.Config, create bool, log *slog.Logger) (usage.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, usageOpenTimeout)
	defer cancel()
	spec := cfg.Usage.Store
	us, err := OpenUsageStore(ctx, spec)
	if err != nil {
		return nil, err
	}
	if s, ok := us.(*sqlite.Store); ok && s.Migration().From != s.Migration().To {
		log.Info("usage store: "+DescribeMigration(s.Migration()), "store", spec)
	}
	if create {
		err = us.Init(ctx)
	} else {
		err = us.Check(ctx)
	}
	if err == nil {
		return us, nil
	}
	us.Close()
	if kind, table := cfg.Usage.Backend(); kind == "dynamodb" && errors.Is(err, usage.ErrNotInitialized) {
		return nil, fmt.Errorf("usage table %q does not exist: run 'mcpgate usage init --config %s' once (%w)", table, cfg.Path, err)
	}
	return nil, fmt.Errorf("usage store %s: %w", spec, err)
}

// OpenUsageStore opens the durable usage store named by a usage.store
// value: "sqlite:PATH" (a file, created if missing; a relative PATH is
// relative to the working directory; its schema is created or upgraded on
// open) or "dynamodb:TABLE" (region, endpoint and credentials from the
// standard AWS environment; the table is not created).
func OpenUsageStore(ctx context.Context, spec string) (usage.Store, error) {
	kind, target, _ := strings.Cut(spec, ":")
	switch kind {
	case "sqlite":
		s, err := sqlite.OpenContext(ctx, target)
		if err != nil {
			return nil, err
		}
		return s, nil
	case "dynamodb":
		s, err := dynamodb.Open(ctx, target)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("unknown usage store %q (want sqlite:PATH or dynamodb:TABLE)", spec)
}

// DescribeMigration says what opening an SQLite usage store did to its
// schema, for logs and mcpgate usage init.
func DescribeMigration(m sqlite.Migration) string {
	switch {
	case m.Created:
		return fmt.Sprintf("created the usage table (schema version %d)", m.To)
	case m.From != m.To:
		return fmt.Sprintf("upgraded the schema from version %d to %d", m.From, m.To)
	}
	return fmt.Sprintf("already initialized (schema version %d), nothing to do", m.To)
}
