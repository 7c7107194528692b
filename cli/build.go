package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
)

// authOptions maps the auth section of a config to auth.Options, reading
// the HS256 secret from the environment variable the config names.
func authOptions(cfg *policy.Config, log *slog.Logger) (auth.Options, error) {
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
		Leeway:         authLeeway(j.Leeway),
		Logger:         log,
	}
	if j.HS256SecretEnv != "" {
		secret := os.Getenv(j.HS256SecretEnv)
		if secret == "" {
			return opts, fmt.Errorf("auth.jwt.hs256_secret_env: environment variable %s is not set or empty", j.HS256SecretEnv)
		}
		opts.HS256Secret = []byte(secret)
	}
	return opts, nil
}

// authLeeway maps auth.jwt.leeway, where 0s means no leeway (the config
// fills in its default), to auth.Options.Leeway, where 0 means auth's
// default and a negative value means none.
func authLeeway(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func buildAuth(ctx context.Context, cfg *policy.Config, log *slog.Logger) (*auth.Authenticator, error) {
	opts, err := authOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	a, err := auth.New(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return a, nil
}

// sharedStore is the Redis limit store with its client.
type sharedStore struct {
	store  limit.GuardedStore
	client rueidis.Client
}

func (s *sharedStore) probe(ctx context.Context) error {
	return s.client.Do(ctx, s.client.B().Ping().Build()).Error()
}

// buildSharedStore connects to store.redis; nil when the config has none.
func buildSharedStore(cfg *policy.Config) (*sharedStore, error) {
	if len(cfg.Store.Redis) == 0 {
		return nil, nil
	}
	opt, err := redisstore.ClientOption(cfg.Store.Redis...)
	if err != nil {
		return nil, fmt.Errorf("store.redis: %w", err)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("store.redis: cannot connect: %w", err)
	}
	st, err := redisstore.New(client, &redisstore.Options{Timeout: cfg.Store.Timeout})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &sharedStore{store: st, client: client}, nil
}
