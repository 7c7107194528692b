package policy

import (
	"errors"
	"strings"
	"testing"
)

// upstream.timeout, upstreams[].timeout, tools.<n>.timeout,
// upstream.max_duration and sessions.idle_timeout feed sums and doubles
// (the breaker's probe lease is 2*upstream.timeout+5s, the federation's
// session timeout 2*sessions.idle_timeout): above limit.MaxPeriod (9600h)
// Parse refuses them, naming the field and its line, rather than accept a
// file whose arithmetic overflows into a negative duration.
func TestHugeCallDurationsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml, want string
	}{
		{"upstream.timeout", "upstream: {url: http://127.0.0.1:9000/mcp, timeout: 2000000h}\nauth: {jwt: {hs256_secret_env: SECRET}}\n",
			"m.yaml:1: upstream.timeout: must be at most 9600h0m0s"},
		{"upstream.max_duration", "upstream: {url: http://127.0.0.1:9000/mcp, max_duration: 9600h0m0.001s}\nauth: {jwt: {hs256_secret_env: SECRET}}\n",
			"m.yaml:1: upstream.max_duration: must be at most 9600h0m0s"},
		{"sessions.idle_timeout", head + "sessions: {idle_timeout: 2000000h}\n",
			"m.yaml:3: sessions.idle_timeout: must be at most 9600h0m0s"},
		{"upstreams[].timeout", "upstreams: [{name: a, url: http://127.0.0.1:9000/mcp, timeout: 2562047h}]\nauth: {jwt: {hs256_secret_env: SECRET}}\n",
			"m.yaml:1: upstreams[0].timeout: must be at most 9600h0m0s"},
		{"tools.<n>.timeout", "upstreams: [{name: a, url: http://127.0.0.1:9000/mcp}]\nauth: {jwt: {hs256_secret_env: SECRET}}\ntools: {a__x: {timeout: 10000h}}\n",
			"m.yaml:3: tools.a__x.timeout: must be at most 9600h0m0s"},
	} {
		_, err := Parse("m.yaml", []byte(c.yaml))
		var es Errors
		if !errors.As(err, &es) || len(es) != 1 || !strings.HasPrefix(es[0].Error(), c.want) {
			t.Errorf("%s: got %v, want one problem starting %q", c.name, err, c.want)
		}
	}
	// The bound itself is accepted.
	cfg, err := Parse("m.yaml", []byte("upstream: {url: http://127.0.0.1:9000/mcp, timeout: 9600h, max_duration: 9600h}\nauth: {jwt: {hs256_secret_env: SECRET}}\nsessions: {idle_timeout: 9600h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream.Timeout != cfg.Sessions.IdleTimeout || cfg.Upstream.MaxDuration != cfg.Upstream.Timeout {
		t.Errorf("9600h not kept: %+v %+v", cfg.Upstream, cfg.Sessions)
	}
}
