package gateway

import (
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/policy"
)

// SetAdminToken makes token the bearer token of /admin/* from the next
// admin request on ("" disables the admin API: every call answers 401).
// A reload calls it with the token the new config names; requests already
// authorized finish. It is safe for concurrent use.
func (g *Gateway) SetAdminToken(token string) {
	b := []byte(token)
	g.adminToken.Store(&b)
}

// restartOnly lists the fields whose values differ between old and cfg but
// are read at start only, so that a reload keeps their old values. Each
// has its reason in docs/config.md ("Reload"); in short:
//
//   - listen, server.read_header_timeout, server.idle_timeout,
//     server.max_connections: the listener and http.Server are built at
//     start, and net/http reads its timeouts without synchronisation;
//   - store.*, cache.redis, cache.timeout, cache.max_*, usage.*: connections, and the
//     counters, leases and meters that live in them (a new store would
//     start empty while calls in flight still hold the old one's leases);
//   - cache.warm: warming runs once, before /readyz turns ready;
//   - auth.session_secret_env: changing the key would end every open
//     session at once.
//
// store.on_error is not listed: it is read per call and follows reloads.
func restartOnly(old, cfg *policy.Config) []string {
	var out []string
	for _, f := range startOnlyFields {
		if fmt.Sprint(f.get(old)) != fmt.Sprint(f.get(cfg)) {
			out = append(out, f.name)
		}
	}
	return out
}

// startOnlyFields are the settings read at start only, each with how to
// read it from a config.
var startOnlyFields = []struct {
	name string
	get  func(c *policy.Config) any
}{
	{"listen", func(c *policy.Config) any { return c.Listen }},
	{"store.redis", func(c *policy.Config) any { return c.Store.Redis }},
	{"store.timeout", func(c *policy.Config) any { return c.Store.Timeout }},
	{"cache.redis", func(c *policy.Config) any { return c.Cache.Redis }},
	{"cache.timeout", func(c *policy.Config) any { return c.Cache.Timeout }},
	{"cache.max_entries", func(c *policy.Config) any { return c.Cache.MaxEntries }},
	{"cache.max_bytes", func(c *policy.Config) any { return c.Cache.MaxBytes }},
	{"cache.warm", func(c *policy.Config) any { return c.Cache.Warm }},
	{"usage.store", func(c *policy.Config) any { return c.Usage.Store }},
	{"usage.flush_interval", func(c *policy.Config) any { return c.Usage.FlushInterval }},
	{"auth.session_secret_env", func(c *policy.Config) any { return c.Auth.SessionSecretEnv }},
	{"server.read_header_timeout", func(c *policy.Config) any { return c.Server.ReadHeaderTimeout }},
	{"server.idle_timeout", func(c *policy.Config) any { return c.Server.IdleTimeout }},
	{"server.max_connections", func(c *policy.Config) any { return c.Server.MaxConnections }},
	{"audit.file", func(c *policy.Config) any { return c.Audit.File }},
	// The servers of upstreams: are connected (and started) once; their
	// limits are rules like any other and follow a reload.
	{"upstreams[].name", upstreamsField(func(u policy.UpstreamServer) any { return u.Name })},
	{"upstreams[].url", upstreamsField(func(u policy.UpstreamServer) any { return u.URL })},
	{"upstreams[].command", upstreamsField(func(u policy.UpstreamServer) any { return u.Command })},
	{"upstreams[].env", upstreamsField(func(u policy.UpstreamServer) any { return u.Env })},
	{"upstreams[].headers", upstreamsField(func(u policy.UpstreamServer) any { return u.Headers })},
	{"upstreams[].timeout", upstreamsField(func(u policy.UpstreamServer) any { return u.Timeout })},
	{"upstreams[].prefix", upstreamsField(func(u policy.UpstreamServer) any { return u.Prefix })},
	{"tools.<name>.timeout", func(c *policy.Config) any {
		out := map[string]time.Duration{}
		for name, t := range c.Tools {
			if t.Timeout > 0 {
				out[name] = t.Timeout
			}
		}
		return out
	}},
}

// upstreamsField reads one setting of every upstream of upstreams:.
func upstreamsField(get func(policy.UpstreamServer) any) func(c *policy.Config) any {
	return func(c *policy.Config) any {
		out := make([]any, len(c.Upstreams))
		for i, u := range c.Upstreams {
			out[i] = get(u)
		}
		return out
	}
}
