package policy

import (
	"slices"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// Defaults applied by Parse to fields the file leaves out (or sets to null).
const (
	DefaultListen        = "127.0.0.1:8080"
	DefaultTierName      = "free"
	DefaultMaxBodyBytes  = 4 << 20
	DefaultUpstreamWait  = 60 * time.Second
	DefaultStoreTimeout  = 25 * time.Millisecond
	DefaultUsageStore    = "sqlite:mcpgate-usage.db"
	DefaultFlushInterval = time.Second
	DefaultCooldown      = 30 * time.Second
	DefaultMaxCooldown   = 10 * time.Minute
	DefaultTenantClaim   = "tenant_id"
	DefaultTierClaim     = "tier"
	DefaultScopeClaim    = "scope"

	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultIdleTimeout       = 180 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultMaxConnections    = 1024
	DefaultLeeway            = 30 * time.Second
	DefaultSessionsPerTenant = 100
	DefaultSessionsPerSubj   = 10
	DefaultSessionIdle       = 30 * time.Minute
)

// Config is a validated configuration. Parse returns it fully defaulted; it
// is never modified afterwards, so one *Config may be read by any number of
// goroutines. A reload builds a new Config.
type Config struct {
	Path     string // the file it was loaded from (the name given to Parse)
	Listen   string // host:port of the gateway's listener
	Upstream Upstream
	// Upstreams are the MCP servers behind the gateway when it fronts more
	// than one (upstreams:). Empty: the single Upstream.URL.
	Upstreams   []UpstreamServer
	Auth        Auth
	Store       Store
	Usage       Usage
	DefaultTier string // the tier of a token without a (known) tier claim; a key of Tiers when Tiers is not empty
	Tiers       map[string]Tier
	Global      []Rule // rules counted across all tenants; Per is always keyspace.PerGlobal
	Cache       Cache
	Tools       map[string]Tool
	Breaker     Breaker
	Server      Server
	Sessions    Sessions
	Audit       Audit
	// Warnings are non-fatal problems, each "file:line: field: problem"
	// (for example an unset ${VAR}). The caller decides whether to log them.
	Warnings []string

	// rules[tier] are the tenant-scoped rules of a tools/call in that tier,
	// precombined (see callRules). Built by Parse so that RulesFor does not
	// allocate on the request path.
	rules map[string]*callRules
	// methodRules[tier][method] are the tier's rules of a method other than
	// tools/call (with the built-in defaults where the tier has none), and
	// methodRules[tier][""] those of methods no rule names. methodGlobal is
	// the same for the global list.
	methodRules  map[string]map[string][]Rule
	methodGlobal map[string][]Rule
	global       []Rule // the global rules of tools/call
}

// callRules are one tier's tools/call rules, each list the concatenation
// RulesFor returns, without spare capacity.
type callRules struct {
	// byTool[tool], for each tool of Config.Tools: the tier's rules, then
	// those of the tool's upstream (Config.UpstreamOf), then the tool's.
	// byTool[""]: the tier's rules alone.
	byTool map[string][]Rule
	// byUpstream[i]: the tier's rules, then Upstreams[i].Limits; for the
	// tools of upstream i that Config.Tools does not list.
	byUpstream [][]Rule
}

// Upstream is the MCP server the gateway forwards to. With Config.Upstreams,
// URL is empty and Headers unused (each UpstreamServer has its own); the
// other settings apply to the calls of every upstream, Timeout as the
// default of UpstreamServer.Timeout.
type Upstream struct {
	URL string // http or https; ${VAR} expanded; "" with Config.Upstreams
	// Headers are set on every request to URL (values ${VAR} expanded).
	// They are not sent to the servers of Config.Upstreams. The caller's
	// own credentials are never forwarded.
	Headers map[string]string
	// IdentityHeaders adds X-Mcp-Tenant and X-Mcp-Subject to upstream requests.
	IdentityHeaders bool
	// MaxBodyBytes caps a request body read from a client (default 4 MiB).
	MaxBodyBytes int64
	// Timeout is the idle timeout of one upstream call (default 60s): the
	// call fails when the upstream sends nothing for this long. Each event
	// of a streamed answer (progress, a log message, a server request)
	// starts it again.
	Timeout time.Duration
	// MaxDuration, when positive, is a hard cap on one upstream call
	// however much it streams. Zero means none.
	MaxDuration time.Duration
}

// UpstreamServer is one MCP server of upstreams:.
type UpstreamServer struct {
	Name    string            // [a-z0-9-]+ (1..63 chars), unique among upstreams
	URL     string            // Streamable HTTP endpoint (http or https, ${VAR} expanded); exclusive with Command
	Command []string          // stdio: the argv of the process mcpgate runs (each element ${VAR} expanded); exclusive with URL
	Env     map[string]string // stdio only: added to the process's environment (values ${VAR} expanded)
	Headers map[string]string // HTTP only: set on every request (values ${VAR} expanded; same checks as upstream.headers)
	Timeout time.Duration     // idle timeout of one call to this server; default Upstream.Timeout (itself default DefaultUpstreamWait)
	Prefix  string            // exposed tool and prompt names are Prefix + the server's name; default Name + "__"; "" exposes bare names
	Limits  []Rule            // rules counting calls of this upstream's tools (tools/call only), evaluated with the tier's rules in the tenant's slot
}

// JWT says how tokens are verified. Exactly one key source is set:
// HS256SecretEnv, JWKSURL, JWKSFile or PublicKeyFile.
type JWT struct {
	HS256SecretEnv string // name of the environment variable holding the HS256 secret
	JWKSURL        string // http(s) URL of a JWKS document
	JWKSFile       string // path of a JWKS document
	PublicKeyFile  string // PEM public key (RS256, ES256 or EdDSA)
	Issuer         string // checked when not empty
	Audience       string // checked when not empty
	TenantClaim    string // default "tenant_id"; a token without it is refused
	TierClaim      string // default "tier"; missing or unknown: Config.DefaultTier
	ScopeClaim     string // default "scope"; tools:<name>|*, prompts:<name>|*, resources:<uri glob> (auth.ParseScopes)
	// RequireExpiry refuses tokens without an exp claim (default true: a
	// token that never expires cannot be revoked by waiting).
	RequireExpiry bool
	// RequireSubject refuses tokens without a sub claim (default false:
	// such tokens share one per-subject limit and breaker per tenant).
	RequireSubject bool
	// Leeway is the clock skew allowed on exp, nbf and iat (default 30s,
	// at most 5m).
	Leeway time.Duration
}

// Auth is the authentication of agents and of the admin API.
type Auth struct {
	JWT JWT
	// AdminTokenEnv names the environment variable holding the bearer token of
	// /admin/*. Empty: no admin token is configured.
	AdminTokenEnv string
	// SessionSecretEnv names the environment variable holding the key that
	// binds MCP session ids to callers. Every instance must share it. Empty:
	// derived from the HS256 secret, or random per process (sessions then
	// stay valid on the instance that opened them only).
	SessionSecretEnv string
	// AuthorizationServers are the issuer URLs of the OAuth authorization
	// servers that issue tokens for this gateway (https; http on a loopback
	// host only). Not empty: the gateway serves RFC 9728 protected-resource
	// metadata listing them, and its 401s and 403s point at it (MCP
	// authorization). Empty: no metadata, 401s as without OAuth.
	AuthorizationServers []string
	// Resource is the gateway's OAuth resource identifier, its public MCP
	// URL (e.g. https://mcp.example.com/mcp). Set: tokens must carry it in
	// aud (as well as JWT.Audience when set), and the metadata names it.
	// Empty: the metadata derives it from each request (TLS or not, Host,
	// "/mcp"; forwarded headers are never trusted) and aud is not checked
	// against it. Set it behind a proxy.
	Resource string
}

// FailurePolicy says what a decision does when the store fails or times out.
type FailurePolicy string

// The failure policies.
const (
	FailOpen   FailurePolicy = "open"   // admit the call
	FailClosed FailurePolicy = "closed" // refuse it with 503
	FailLocal  FailurePolicy = "local"  // decide with the in-process store and the same rules
)

// Valid reports whether p is one of the failure policies.
func (p FailurePolicy) Valid() bool { return p == FailOpen || p == FailClosed || p == FailLocal }

// Store is where rate-limit counters live.
type Store struct {
	// Redis is nil for the in-process store (one instance). Otherwise it has
	// either one element, a URL (redis://, rediss://, valkey://, valkeys://,
	// unix://) or a host:port, or several host:port Cluster seed addresses.
	Redis   []string
	Timeout time.Duration // deadline of one limit decision (default 25ms)
	OnError FailurePolicy // default policy of tools without their own (default open)
}

// Usage is the durable usage (metering) store.
type Usage struct {
	// Store is "sqlite:PATH" or "dynamodb:TABLE" (default
	// "sqlite:mcpgate-usage.db"). See Backend.
	Store         string
	FlushInterval time.Duration // how often live counters are written (default 1s)
}

// Backend splits Store into its kind ("sqlite" or "dynamodb") and the path
// or table name.
func (u Usage) Backend() (kind, target string) {
	kind, target, _ = strings.Cut(u.Store, ":")
	return kind, target
}

// Tier is a service level: a monthly quota and tenant-scoped limits.
type Tier struct {
	MonthlyQuota int64  // cost units per calendar month (UTC); 0 means no quota
	Limits       []Rule // Per is never keyspace.PerGlobal; default keyspace.PerTenant

	// DenyAs is how the tier's denied tools/calls are answered; "" means
	// DenyHTTP. A tool's own DenyAs wins (see Config.DenyAs).
	DenyAs DenyMode
}

// Rule is a limit.Rule together with the scope of its counter and the MCP
// methods it counts.
type Rule struct {
	limit.Rule
	Per keyspace.Per
	// Methods are the JSON-RPC request methods the rule counts: nil means
	// tools/call only; "*" means every request method; MethodNotifications
	// the notifications and responses of clients. See Applies.
	Methods []string
}

// AllMethods in Rule.Methods selects every request method (not
// MethodNotifications, which is no request).
const AllMethods = "*"

// Applies reports whether r counts calls of method.
func (r Rule) Applies(method string) bool {
	if r.Methods == nil {
		return method == MethodToolsCall
	}
	for _, m := range r.Methods {
		if m == method || m == AllMethods && method != MethodNotifications {
			return true
		}
	}
	return false
}

// sameRule reports whether a and b are the same rule in every setting.
func sameRule(a, b Rule) bool {
	return a.Rule == b.Rule && a.Per == b.Per && slices.Equal(a.Methods, b.Methods)
}

// Server protects the HTTP listener against slow, idle and hostile clients.
// Every field is positive after Parse.
type Server struct {
	ReadHeaderTimeout time.Duration // request headers must arrive within this [10s]
	// ReadTimeout bounds reading one request body: a stalled POST body is
	// cut after it [60s].
	ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that carries no request
	// for this long [180s].
	IdleTimeout time.Duration
	// WriteTimeout bounds one write to the client. A streamed answer (SSE)
	// gets a new deadline for each event, so a long stream lives as long
	// as it keeps moving and a client that stops reading is cut [60s].
	WriteTimeout time.Duration
	// MaxConnections caps concurrent client connections; further ones
	// wait in the kernel's accept queue [1024].
	MaxConnections int
	// MaxRequestsPerTenant caps the requests one tenant may have in
	// progress on one instance, open streams (GET, and POSTs answered with
	// a stream) included; one more gets 429. It keeps a single tenant from
	// holding every connection [max_connections / 4, at least 1].
	MaxRequestsPerTenant int
	// AllowedOrigins are the Origin header values accepted besides the
	// gateway's own host ("*" accepts any). A request without Origin is
	// accepted (non-browser clients send none); any other is refused 403.
	AllowedOrigins []string

	// derivedTenantCap is the MaxRequestsPerTenant that Parse (or
	// WithMaxConnections) derived because the file left it out, 0 if none.
	// It is a value, not a mark, because MaxRequestsPerTenant is exported:
	// a caller that sets it in code after Parse has written its own cap,
	// which must not follow MaxConnections.
	derivedTenantCap int
}

// WithMaxConnections returns s with the connection cap n: the one in force
// when a reload keeps it (it is read at start only). A per-tenant cap the
// file left out, and that is still the one derived, is derived from n, as
// Parse derives it, so that it stays a share of the connections there
// really are; any other (from the file or set in code) stays.
func (s Server) WithMaxConnections(n int) Server {
	s.MaxConnections = n
	if s.derivedTenantCap != 0 && s.MaxRequestsPerTenant == s.derivedTenantCap {
		s.MaxRequestsPerTenant = tenantCapOf(n)
		s.derivedTenantCap = s.MaxRequestsPerTenant
	}
	return s
}

// tenantCapOf is the default per-tenant cap under n connections: a
// quarter of them, at least 1.
func tenantCapOf(n int) int { return max(1, n/4) }

// Audit configures the audit log: one JSON line per governed call (see
// package audit). The zero value writes none.
type Audit struct {
	// File is the path the lines are appended to, "-" for standard
	// output, "" for no audit log [""]. It is opened at start (a file that
	// cannot be opened stops the gateway) and reopened on SIGHUP and
	// POST /admin/reload, for log rotation.
	File string
	// IncludeArguments writes a tools/call's arguments into its line
	// [false]. Tokens are never written.
	IncludeArguments bool
}

// Sessions caps the MCP sessions one caller may keep open upstream: each
// initialize that opens a session holds a slot until the session ends
// (DELETE) or stays unused for IdleTimeout, when the gateway ends it
// upstream.
type Sessions struct {
	MaxPerTenant  int           // live sessions of one tenant [100]
	MaxPerSubject int           // live sessions of one subject of a tenant [10]
	IdleTimeout   time.Duration // [30m]
}

// Cost is what one call of a tool charges against limits, quotas and usage.
// Either Fixed is set (at least 1), or Estimate is charged up front and the
// usage is corrected afterwards from the number found in the tool's result
// at the dotted path FromResult (for example "_meta.usage.tokens").
type Cost struct {
	Fixed      int64
	Estimate   int64
	FromResult string
}

// Charge is the cost charged before the call: Fixed, or Estimate.
func (c Cost) Charge() int64 {
	if c.Fixed > 0 {
		return c.Fixed
	}
	return c.Estimate
}

// ToolCache makes a tool's results cacheable.
type ToolCache struct {
	TTL         time.Duration // lifetime of a successful result; always positive
	Jitter      float64       // fraction (0..1) the TTL is randomly shortened by, from "10%"
	NegativeTTL time.Duration // lifetime of an isError result; 0 means they are not cached
	Shared      bool          // false (default): entries are per tenant
	// Tags are templates such as "product:{{args.id}}" attached to each entry
	// so that Tool.Invalidates can drop them.
	Tags []string
}

// Tool is the configuration of one upstream tool, under the name clients
// see (with Config.Upstreams, the exposed name: Prefix + the server's
// name). Tools not listed have the zero Tool with Cost{Fixed: 1}.
type Tool struct {
	Cost        Cost
	Cache       *ToolCache    // nil: results are not cached
	OnError     FailurePolicy // "": Store.OnError
	Limits      []Rule        // Per is never keyspace.PerGlobal; default keyspace.PerTenantTool
	Invalidates []string      // tag templates dropped after a successful call

	// DenyAs is how denied calls of the tool are answered, whatever the
	// caller's tier; "" means the tier's (see Config.DenyAs).
	DenyAs DenyMode

	// Timeout, when positive, overrides the idle timeout of the tool's
	// upstream for calls of this tool (upstreams: only). Zero: the upstream's.
	Timeout time.Duration
}

// DefaultCacheTimeout is Cache.Timeout when the file leaves it out.
const DefaultCacheTimeout = 25 * time.Millisecond

// Cache is the tool-result cache.
type Cache struct {
	Redis []string // like Store.Redis; nil: use Store.Redis
	// Timeout is the deadline of one cache store operation (a read, a
	// lock, a write, a wait's subscription, an invalidation round trip): a
	// cached call whose store operation misses it is served uncached.
	// Default DefaultCacheTimeout.
	Timeout time.Duration
	Warm    []Warm // calls made at startup, before the gateway reports ready
	// MaxEntries and MaxBytes bound the in-process cache (used when there
	// is no Redis): entries held and bytes of values. 0 means the cache
	// package's defaults (cache.DefaultMaxEntries, cache.DefaultMaxBytes).
	MaxEntries int
	MaxBytes   int64 // at least minCacheBytes
}

// minCacheBytes is the least cache.max_bytes: the in-process cache splits
// it over its shards and keeps no value over 1/128 of it.
const minCacheBytes = 1 << 20

// Warm is one call made to fill the cache at startup.
type Warm struct {
	Tool   string         // a key of Config.Tools with a Cache
	Args   map[string]any // the call's arguments, as JSON would decode them (never nil)
	Tenant string         // whose entry it fills; required unless the tool's cache is Shared
}

// IdenticalCalls opens the breaker after Count calls of the same tool with
// the same arguments within a sliding Within. Count 0 disables the check.
type IdenticalCalls struct {
	Count  int
	Within time.Duration
}

// Breaker is the runaway-agent circuit breaker. A threshold of 0 disables
// that trigger; with all three at 0 the breaker is off (see Enabled).
type Breaker struct {
	Key                 string // "subject" (default), "tenant" or "session"
	ConsecutiveDenials  int
	ConsecutiveFailures int
	IdenticalCalls      IdenticalCalls
	Cooldown            time.Duration // how long an open breaker refuses calls (default 30s)
	MaxCooldown         time.Duration // cap of the cooldown, doubled by each failed half-open probe (default 10m, at least Cooldown)
	AlertWebhook        string        // http(s) URL POSTed a JSON event when a breaker opens; "" for none
}

// Enabled reports whether any trigger of the breaker is set.
func (b Breaker) Enabled() bool {
	return b.ConsecutiveDenials > 0 || b.ConsecutiveFailures > 0 || b.IdenticalCalls.Count > 0
}

// ResolveTier returns the tier a token's tier claim selects: the named tier
// when it exists, else DefaultTier. ok is false when Tiers has no entry for
// the result (Tiers is empty), in which case t is the zero Tier.
func (c *Config) ResolveTier(name string) (resolved string, t Tier, ok bool) {
	if t, ok := c.Tiers[name]; ok {
		return name, t, true
	}
	t, ok = c.Tiers[c.DefaultTier]
	return c.DefaultTier, t, ok
}

// RulesFor returns the rules of one tools/call: the tier's rules, then the
// Limits of the tool's upstream (UpstreamOf; upstreams: only), then the
// tool's own (all tenant-scoped, to be evaluated together in the tenant's
// slot), and the global rules. An unknown tier means DefaultTier. The
// slices are shared and must not be modified (appending to them is safe:
// they have no spare capacity). It does not allocate on a Config from
// Parse.
func (c *Config) RulesFor(tier, tool string) (tenantScoped []Rule, global []Rule) {
	global = c.global
	tier, t, _ := c.ResolveTier(tier)
	if rs, ok := c.rules[tier]; ok {
		if r, ok := rs.byTool[tool]; ok {
			return r, global
		}
		if up := c.upstreamIndex(tool); up >= 0 && up < len(rs.byUpstream) {
			return rs.byUpstream[up], global
		}
		return rs.byTool[""], global
	}
	var upLimits []Rule
	if up := c.upstreamIndex(tool); up >= 0 {
		upLimits = c.Upstreams[up].Limits
	}
	return combine(forMethod(t.Limits, MethodToolsCall), upLimits, c.Tools[tool].Limits), global
}

// LongestCallTimeout is the longest idle timeout of one upstream call:
// upstream.timeout, an upstream's timeout or a tool's.
func (c *Config) LongestCallTimeout() time.Duration {
	longest := c.Upstream.Timeout
	for _, u := range c.Upstreams {
		longest = max(longest, u.Timeout)
	}
	for _, t := range c.Tools {
		longest = max(longest, t.Timeout)
	}
	return longest
}

// UpstreamOf returns the name of the upstream (of Upstreams) that exposes
// tool, judged by the name alone: the upstream whose Prefix is the longest
// non-empty prefix of tool, tool being longer than it; failing that, the
// one upstream with Prefix "" when exactly one has it (and tool is not
// empty). ok is false otherwise: no upstream matches, or several have
// Prefix "" (then only the gateway, from their tool lists, knows). It does
// not allocate.
func (c *Config) UpstreamOf(tool string) (name string, ok bool) {
	if i := c.upstreamIndex(tool); i >= 0 {
		return c.Upstreams[i].Name, true
	}
	return "", false
}

// upstreamIndex is UpstreamOf as an index into Upstreams, -1 for none.
func (c *Config) upstreamIndex(tool string) int {
	best, bare, bares := -1, -1, 0
	for i := range c.Upstreams {
		p := c.Upstreams[i].Prefix
		switch {
		case p == "":
			bare, bares = i, bares+1
		case len(tool) > len(p) && strings.HasPrefix(tool, p) && (best < 0 || len(p) > len(c.Upstreams[best].Prefix)):
			best = i
		}
	}
	switch {
	case best >= 0:
		return best
	case bares == 1 && tool != "":
		return bare
	}
	return -1
}

// RulesForMethod returns the rules of one request of a method other than
// tools/call (for tools/call use RulesFor): the tier's rules that name the
// method, or the built-in default rule for it (DefaultInitializeRule,
// DefaultRequestsRule) when the tier has none, and the global rules that
// name it. The slices are shared and must not be modified.
func (c *Config) RulesForMethod(tier, method string) (tenantScoped []Rule, global []Rule) {
	if method == MethodToolsCall {
		return c.RulesFor(tier, "")
	}
	tier, _, _ = c.ResolveTier(tier)
	byMethod := c.methodRules[tier]
	r, ok := byMethod[method]
	if !ok {
		r = byMethod[""]
	}
	g, ok := c.methodGlobal[method]
	if !ok {
		g = c.methodGlobal[""]
	}
	return r, g
}

// ToolOnError returns the failure policy of tool: its own, else the store's,
// else FailOpen.
func (c *Config) ToolOnError(tool string) FailurePolicy {
	if p := c.Tools[tool].OnError; p != "" {
		return p
	}
	if c.Store.OnError != "" {
		return c.Store.OnError
	}
	return FailOpen
}

// ToolCost returns the cost of one call of tool (Cost{Fixed: 1} for tools
// the configuration does not list).
func (c *Config) ToolCost(tool string) Cost {
	if t, ok := c.Tools[tool]; ok && (t.Cost.Fixed > 0 || t.Cost.Estimate > 0) {
		return t.Cost
	}
	return Cost{Fixed: 1}
}

// combine concatenates rule lists into a new slice without spare
// capacity, or nil.
func combine(lists ...[]Rule) []Rule {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	if n == 0 {
		return nil
	}
	out := make([]Rule, 0, n)
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// Reindexed returns a copy of c whose rules RulesFor reads are combined
// anew from its Tiers, Global, Tools and Upstreams: Parse combines them in
// advance, so a copy whose Upstreams or Tools were replaced after Parse
// (a reload keeps the upstreams in force, see gateway.Apply) needs it.
func (c *Config) Reindexed() *Config {
	n := *c
	n.index()
	return &n
}

// index builds c.rules, c.methodRules, c.methodGlobal and c.global.
func (c *Config) index() {
	c.rules = map[string]*callRules{}
	toolUp := make(map[string][]Rule, len(c.Tools)) // the Limits of each listed tool's upstream
	for tool := range c.Tools {
		if i := c.upstreamIndex(tool); i >= 0 {
			toolUp[tool] = c.Upstreams[i].Limits
		}
	}
	c.methodRules = map[string]map[string][]Rule{}
	tiers := make([]string, 0, len(c.Tiers)+1)
	for name := range c.Tiers {
		tiers = append(tiers, name)
	}
	if len(tiers) == 0 {
		tiers = append(tiers, c.DefaultTier)
	}
	for _, name := range tiers {
		t := c.Tiers[name]
		calls := forMethod(t.Limits, MethodToolsCall)
		rs := &callRules{byTool: map[string][]Rule{"": combine(calls)}}
		for tool, tc := range c.Tools {
			rs.byTool[tool] = combine(calls, toolUp[tool], tc.Limits)
		}
		for _, u := range c.Upstreams {
			rs.byUpstream = append(rs.byUpstream, combine(calls, u.Limits))
		}
		c.rules[name] = rs
		byMethod := map[string][]Rule{}
		for _, m := range GovernedMethods() {
			if m == MethodToolsCall {
				continue
			}
			r := forMethod(t.Limits, m)
			if r == nil {
				r = []Rule{defaultRuleFor(m)}
			}
			byMethod[m] = r
		}
		c.methodRules[name] = byMethod
	}
	c.global = forMethod(c.Global, MethodToolsCall)
	c.methodGlobal = map[string][]Rule{}
	for _, m := range GovernedMethods() {
		if m != MethodToolsCall {
			c.methodGlobal[m] = forMethod(c.Global, m)
		}
	}
}

// GovernedMethods are the names RulesForMethod knows rules of: the
// request methods (tools/call included), MethodNotifications and "" (any
// other method), in a new slice.
func GovernedMethods() []string {
	return append(slices.Clip(RequestMethods), MethodNotifications, "")
}

// forMethod returns the rules of rs that count method ("" stands for a
// method no rule can name: only "*" rules count it), in a new slice
// without spare capacity, or nil.
func forMethod(rs []Rule, method string) []Rule {
	var out []Rule
	for _, r := range rs {
		if method == "" && slices.Contains(r.Methods, AllMethods) || method != "" && r.Applies(method) {
			out = append(out, r)
		}
	}
	return out[:len(out):len(out)]
}
