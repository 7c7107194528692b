// Package policy loads and validates mcpgate's configuration file.
//
// Parse (and Load, which reads a file first) decodes strict YAML: unknown
// keys, wrong types and invalid values are errors, and every problem found
// is reported at once, sorted by line, each printed as
//
//	mcpgate.yaml:42: tiers.free.limits[1].algorithm: unknown algorithm "lru" (want one of fixed_window, ...)
//
// The returned Errors matches ErrInvalidConfig with errors.Is. A valid file
// gives a fully defaulted *Config that is never modified afterwards and so
// may be shared by any number of goroutines; reloading builds a new one.
//
// # Value syntax
//
// Durations use Go syntax (25ms, 1s, 1m, 720h; there is no "d"). A bare 0
// is accepted as a zero duration, other bare numbers are refused because
// they have no unit. Percentages are strings, "10%" (0% to 100%). Integers
// must not be quoted. A key set to null (`key:` with no value) keeps its
// default. Anchors, aliases and merge keys (<<) are supported. In
// upstream.url and upstream.headers values, and in the url, headers,
// command and env values of upstreams, ${NAME} is replaced with the
// environment variable NAME ($${ writes a literal ${); an unset variable
// becomes "" and adds a warning to Config.Warnings. store.redis and
// cache.redis addresses are expanded too, but there an unset or empty
// variable is an error: an address that expanded to nothing would silently
// make a shared store an in-process one.
//
// # Reference
//
// Defaults are in brackets; "required" fields have none.
//
//	listen                     host:port of the gateway [127.0.0.1:8080]
//	upstream.url               http(s) URL of the Streamable HTTP MCP server (required
//	                           unless upstreams is set; not allowed with it)
//	upstream.headers           name: value added to every request to upstream.url (not
//	                           to the servers of upstreams)
//	upstream.identity_headers  send X-Mcp-Tenant and X-Mcp-Subject upstream [false]
//	upstream.max_body_bytes    largest request body accepted from a client [4194304]
//	upstream.timeout           idle timeout of one upstream call: it fails when the upstream
//	                           sends nothing for this long; each streamed event restarts it [60s]
//	upstream.max_duration      hard cap on one upstream call however much it streams [0: none]
//	upstreams[]                the MCP servers behind the gateway when it fronts several
//	                           (the other upstream settings apply to each): name (required;
//	                           1 to 63 of [a-z0-9-], unique); url (Streamable HTTP) or
//	                           command (stdio: the argv of a process mcpgate runs), exactly
//	                           one; headers (url only) and env (command only), ${VAR}
//	                           expanded; timeout [upstream.timeout]; prefix of the exposed
//	                           tool and prompt names [name + "__"; "" exposes bare names;
//	                           two upstreams never share a non-empty prefix, and limits are
//	                           refused on an upstream with prefix "" when another has it
//	                           too]; limits (rules counting calls of its tools, per defaults
//	                           to tenant)
//	auth.jwt                   exactly one key source: hs256_secret_env (name of an
//	                           environment variable), jwks_url, jwks_file, public_key_file;
//	                           issuer and audience are checked when set; tenant_claim
//	                           [tenant_id], tier_claim [tier], scope_claim [scope]: a
//	                           space-separated string or array of tools:<name> /
//	                           tools:<prefix>* / tools:*, prompts:<name> / prompts:<prefix>* /
//	                           prompts:*, resources:<uri glob> / resources:*
//	                           ('*' matches any run of characters, '/' included; what no
//	                           scope grants is refused with 403 and hidden from lists);
//	                           require_expiry (refuse tokens without exp) [true],
//	                           require_subject (refuse tokens without sub) [false],
//	                           leeway (clock skew on exp, nbf, iat; 0s to 5m) [30s]
//	auth.admin_token_env       environment variable holding the admin bearer token [none]
//	auth.session_secret_env    environment variable holding the key binding MCP session ids
//	                           to callers; shared by all instances [derived from the HS256
//	                           secret, else random per process]
//	auth.authorization_servers issuer URLs of the OAuth authorization servers that issue
//	                           tokens for this gateway (https; http only for localhost,
//	                           127.0.0.1 and [::1]; no query, fragment or user info). Set:
//	                           RFC 9728 metadata at /.well-known/oauth-protected-resource
//	                           (and .../mcp), 401s carry resource_metadata, 403s
//	                           insufficient_scope with the scope needed [none: no metadata]
//	auth.resource              the gateway's public MCP URL, its OAuth resource identifier
//	                           (https, as above). Set: tokens must carry it in aud, exactly,
//	                           and auth.jwt.audience as well when that is set too (both
//	                           values in an aud array, or one when they are equal). Not
//	                           set: derived per request from TLS, Host and /mcp, never from
//	                           X-Forwarded-* or Forwarded headers, and aud is not checked
//	                           against it; set it behind a proxy [derived]
//	store.redis                "" (in-process store, one instance), one URL (redis://,
//	                           rediss://, valkey://, valkeys://, unix://) or host:port,
//	                           or a list of host:port Cluster seeds [""]
//	store.timeout              deadline of one limit decision [25ms]
//	store.on_error             open | closed | local [open]
//	usage.store                sqlite:PATH | dynamodb:TABLE [sqlite:mcpgate-usage.db]
//	usage.flush_interval       [1s]
//	default_tier               tier of tokens without a known tier claim [free]; must name
//	                           a tier when tiers is not empty
//	tiers.NAME.monthly_quota   cost units per calendar month (UTC), 0 for none [0]
//	tiers.NAME.limits          rules, per defaults to tenant
//	tiers.NAME.deny_as         http | result: how a denied tools/call (rate limit, quota,
//	                           breaker) is answered; see "Denials" below [http]
//	global                     rules counted across all tenants; per is always global
//	cache.redis                like store.redis; "" uses store.redis
//	cache.timeout              deadline of one cache store operation; a cached call whose
//	                           store operation misses it is served uncached [25ms]
//	cache.max_entries          entries the in-process cache (without Redis) holds [100000]
//	cache.max_bytes            bytes of values it holds, at least 1 MiB; a value over 1/128
//	                           of it is served but not kept [268435456]
//	cache.warm[]               {tool, args, tenant}: calls made at startup; the tool must
//	                           have a cache, and tenant is required unless it is shared
//	tools.NAME.cost            N (fixed, at least 1) or {estimate: N [1], from_result: PATH} [1]
//	tools.NAME.cache           {ttl (required), jitter ["0%"], negative_ttl [0: not cached],
//	                           shared [false], tags}
//	tools.NAME.on_error        open | closed | local [store.on_error]
//	tools.NAME.limits          rules, per defaults to tenant_tool
//	tools.NAME.invalidates     tag templates dropped after a successful call
//	tools.NAME.deny_as         http | result, for this tool whatever the tier [the tier's]
//	tools.NAME.timeout         idle timeout of the tool's calls, instead of its upstream's
//	                           (with upstreams only) [the upstream's timeout]
//	breaker.key                subject | tenant | session [subject]
//	breaker.consecutive_denials, breaker.consecutive_failures
//	                           thresholds; 0 disables that trigger [0]
//	breaker.identical_calls    {count (0 disables, else at least 2), within (required with count)}
//	breaker.cooldown           [30s]
//	breaker.max_cooldown       cap of the cooldown, doubled by each failed probe [10m, at least cooldown]
//	breaker.alert_webhook      http(s) URL POSTed when a breaker opens [none]
//	server.read_header_timeout request headers must arrive within this [10s]
//	server.read_timeout        a request body must arrive within this (a stalled body is cut) [60s]
//	server.idle_timeout        an idle keep-alive connection is closed after this [180s]
//	server.write_timeout       bound on one write to a client; a stream gets a new deadline
//	                           for each event, so it lives as long as it keeps moving [60s]
//	server.max_connections     concurrent client connections; at the cap a new client takes the
//	                           slot of the connection idle longest (closed), or waits to be
//	                           accepted while all are busy [1024]
//	server.max_requests_per_tenant
//	                           requests (open streams included) one tenant may have in progress
//	                           on one instance; one more gets 429 [max_connections / 4]
//	server.allowed_origins     Origin values accepted besides the gateway's own host ("*": any);
//	                           requests without Origin are accepted, others get 403 [none]
//	sessions.max_per_tenant    live upstream MCP sessions one tenant may hold [100]
//	sessions.max_per_subject   live upstream MCP sessions one subject may hold [10]
//	sessions.idle_timeout      a session unused this long is ended upstream, freeing its slot [30m]
//	audit.file                 append one JSON line per governed call to this file, "-" for
//	                           standard output; reopened on SIGHUP and POST /admin/reload
//	                           (log rotation); a file that cannot be opened stops the start
//	                           ["": no audit log]
//	audit.include_arguments    write each tools/call's arguments into its line; tokens are
//	                           never written [false]
//
// A rule is {name, per, algorithm, limit, period, burst, shadow, methods}. name (1 to
// 64 of [A-Za-z0-9_.-]), algorithm (see limit.Algorithms), limit (at least
// 1) and period are required; burst only applies to token_bucket and gcra;
// every rule must pass limit.Rule.Validate. per is global, tenant,
// tenant_tool, subject or subject_tool: global rules belong in the global
// list only, and the global list holds nothing else. Names are unique
// within a list, and a tool's rule may not repeat the name and per of a
// tier's rule (the two would count on one key), nor may an upstream's rule
// repeat those of a tier's rule or of a rule of one of its tools. Rules per
// tenant or subject of different tools or upstreams with the same name
// share one counter, which is allowed only when they are identical.
//
// With upstreams, the keys of tools name exposed tools (search__query), and
// Config.RulesFor counts a call with the tier's rules, then the rules of
// the tool's upstream (Config.UpstreamOf), then the tool's.
//
// methods (tier and global rules only) lists the JSON-RPC request methods a
// rule counts (see RequestMethods), "*" for all of them, and
// "notifications" for the notifications and responses a client sends
// (MethodNotifications; "*" does not include them); without it a rule
// counts tools/call. Every other method is governed too: where no rule of
// the tier names a method, DefaultInitializeRule (initialize: 10 per minute
// per tenant), DefaultNotificationsRule (notifications and responses: 600
// per minute, burst 120, per tenant) or DefaultRequestsRule (any other
// request: the same) applies. For a method other than tools/call, the "tool" of tenant_tool
// and subject_tool is the method and its target (the prompt name, the
// resource URI).
//
// # Denials
//
// deny_as: http (the default) answers a denied tools/call with HTTP 429,
// Retry-After and the rate-limit headers, and a JSON-RPC error (code
// -33029, data {scope, rule, limit, remaining, retry_after_seconds}).
// deny_as: result answers it with HTTP 200 and a tools/call result with
// isError: true, a text telling the model what was limited and when to
// retry, and the same data as structuredContent; the headers are the same.
// MCP SDK clients turn a 429 into a transport error without reading its
// body, so only result lets an agent's model see the retry time. A denied
// request of another method (initialize, tools/list, ...) has no tool
// result to carry it and is always answered 429, whatever deny_as says.
//
// Tag templates are text with {{args.NAME}} or {{args.NAME.FIELD}} holes
// filled from the call's arguments, e.g. "product:{{args.id}}".
package policy
