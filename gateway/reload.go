package gateway

import (
	"fmt"
	"maps"
	"slices"
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

// inForce returns cfg as a reload applies it over old, the configuration
// in force: the settings read at start only keep old's values, so that
// Config() and /admin report what is in force, and the defaults derived
// from them follow (server.max_requests_per_tenant, when the file leaves
// it out, is a share of the connections there really are). The federation
// serves the upstreams it started with, each tool with the timeout it
// started with, whatever the file says: so do upstreams and
// tools.<name>.timeout in force, with the file's limits (upstreamsInForce,
// toolsInForce).
func inForce(old, cfg *policy.Config) *policy.Config {
	c := *cfg
	for _, f := range startOnlyFields {
		if f.keep != nil {
			f.keep(&c, old)
		}
	}
	c.Server = c.Server.WithMaxConnections(old.Server.MaxConnections)
	c.Upstreams = upstreamsInForce(old.Upstreams, cfg.Upstreams)
	c.Tools = toolsInForce(old.Tools, cfg.Tools)
	// The rules of a tool combine its upstream's limits, found by the
	// prefixes and positions of Upstreams, which may now differ from the
	// file's.
	return c.Reindexed()
}

// upstreamsInForce are the upstreams that run (old's, in old's order, as
// the federation started them), each with the limits file gives it by its
// name: an upstream file leaves out still runs, without limits, and one it
// adds does not run, so it is left out. Without a federation (old has no
// upstreams) there are none to keep.
func upstreamsInForce(old, file []policy.UpstreamServer) []policy.UpstreamServer {
	if len(old) == 0 {
		return file
	}
	out := make([]policy.UpstreamServer, len(old))
	for i, u := range old {
		u.Limits = nil
		if j := slices.IndexFunc(file, func(f policy.UpstreamServer) bool { return f.Name == u.Name }); j >= 0 {
			u.Limits = file[j].Limits
		}
		out[i] = u
	}
	return out
}

// toolsInForce are file's tools, each with old's timeout: the federation
// reads tools.<name>.timeout at start only, so a tool whose timeout the
// file adds has none in force (its upstream's applies) until a restart,
// and a tool with a timeout in force that the file leaves out stays, with
// that timeout alone.
func toolsInForce(old, file map[string]policy.Tool) map[string]policy.Tool {
	out := maps.Clone(file)
	for name, t := range out {
		t.Timeout = old[name].Timeout
		out[name] = t
	}
	for name, t := range old {
		if _, ok := out[name]; !ok && t.Timeout > 0 {
			if out == nil {
				out = map[string]policy.Tool{}
			}
			out[name] = policy.Tool{Timeout: t.Timeout}
		}
	}
	return out
}

// startOnlyField is a setting read at start only: how to read it from a
// config, and how to copy it from one to another (nil: inForce keeps it
// otherwise, as the upstreams and the tools' timeouts are).
type startOnlyField struct {
	name string
	get  func(c *policy.Config) any
	keep func(dst, src *policy.Config)
}

// field is the startOnlyField that at finds in a config.
func field[T any](name string, at func(c *policy.Config) *T) startOnlyField {
	return startOnlyField{name: name,
		get:  func(c *policy.Config) any { return *at(c) },
		keep: func(dst, src *policy.Config) { *at(dst) = *at(src) }}
}

// startOnlyFields are the settings read at start only.
var startOnlyFields = []startOnlyField{
	field("listen", func(c *policy.Config) *string { return &c.Listen }),
	field("store.redis", func(c *policy.Config) *[]string { return &c.Store.Redis }),
	field("store.timeout", func(c *policy.Config) *time.Duration { return &c.Store.Timeout }),
	field("cache.redis", func(c *policy.Config) *[]string { return &c.Cache.Redis }),
	field("cache.timeout", func(c *policy.Config) *time.Duration { return &c.Cache.Timeout }),
	field("cache.max_entries", func(c *policy.Config) *int { return &c.Cache.MaxEntries }),
	field("cache.max_bytes", func(c *policy.Config) *int64 { return &c.Cache.MaxBytes }),
	field("cache.warm", func(c *policy.Config) *[]policy.Warm { return &c.Cache.Warm }),
	field("usage.store", func(c *policy.Config) *string { return &c.Usage.Store }),
	field("usage.flush_interval", func(c *policy.Config) *time.Duration { return &c.Usage.FlushInterval }),
	field("auth.session_secret_env", func(c *policy.Config) *string { return &c.Auth.SessionSecretEnv }),
	field("server.read_header_timeout", func(c *policy.Config) *time.Duration { return &c.Server.ReadHeaderTimeout }),
	field("server.idle_timeout", func(c *policy.Config) *time.Duration { return &c.Server.IdleTimeout }),
	field("server.max_connections", func(c *policy.Config) *int { return &c.Server.MaxConnections }),
	field("audit.file", func(c *policy.Config) *string { return &c.Audit.File }),
	// The servers of upstreams: are connected (and started) once; their
	// limits are rules like any other and follow a reload.
	{name: "upstreams[].name", get: upstreamsField(func(u policy.UpstreamServer) any { return u.Name })},
	{name: "upstreams[].url", get: upstreamsField(func(u policy.UpstreamServer) any { return u.URL })},
	{name: "upstreams[].command", get: upstreamsField(func(u policy.UpstreamServer) any { return u.Command })},
	{name: "upstreams[].env", get: upstreamsField(func(u policy.UpstreamServer) any { return u.Env })},
	{name: "upstreams[].headers", get: upstreamsField(func(u policy.UpstreamServer) any { return u.Headers })},
	{name: "upstreams[].timeout", get: upstreamsField(func(u policy.UpstreamServer) any { return u.Timeout })},
	{name: "upstreams[].prefix", get: upstreamsField(func(u policy.UpstreamServer) any { return u.Prefix })},
	{name: "tools.<name>.timeout", get: func(c *policy.Config) any {
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
