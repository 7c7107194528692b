package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/mcpgate/mcpgate/limit"
)

// Load reads the file at path and parses it (see Parse). Errors reading the
// file are returned as they are; problems in it as Errors.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates a configuration. name is the file name used in
// problems and Config.Path. Unknown keys, wrong types and invalid values are
// all reported, each as "name:line: field: problem", in an Errors sorted by
// line; on error the Config is nil. Unset ${VAR}s in upstream settings are
// warnings (Config.Warnings), not errors. Parse reads environment variables
// and nothing else.
func Parse(name string, data []byte) (*Config, error) {
	return parse(name, data, false)
}

// LoadEmbedded is Load for the config of an MCP server that embeds the
// enforcement engine (examples/sdkserver) rather than of a gateway: the
// upstream section may be absent, since nothing is forwarded. Everything
// else is read and validated as Load does.
func LoadEmbedded(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return ParseEmbedded(path, data)
}

// ParseEmbedded is Parse for the config of an MCP server that embeds the
// enforcement engine (see LoadEmbedded): upstream may be absent.
func ParseEmbedded(name string, data []byte) (*Config, error) {
	return parse(name, data, true)
}

func parse(name string, data []byte, embedded bool) (*Config, error) {
	d := &decoder{file: name, tierRules: map[string][]ruleRef{}, toolRules: map[string][]ruleRef{}, embedded: embedded}
	root := d.document(data)
	c := &Config{Path: name}
	if root != nil {
		d.config(root, c)
	}
	d.defaults(c)
	if len(d.errs) == 0 || root != nil && !d.over {
		d.check(c, root)
	}
	for _, w := range sortProblems(d.warns) {
		c.Warnings = append(c.Warnings, w.Error())
	}
	if len(d.errs) > 0 {
		return nil, Errors(sortProblems(d.errs))
	}
	c.index()
	return c, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// document parses data into its root node: nil for an empty file, or when
// data is not YAML (then reported).
func (d *decoder) document(data []byte) (root *yaml.Node) {
	// yaml.v3 reports encoding problems without a line: find it first.
	if line, msg := badText(data); line > 0 {
		d.errs = append(d.errs, &Error{File: d.file, Line: line, Msg: msg})
		return nil
	}
	defer func() {
		if r := recover(); r != nil { // yaml.v3 is not supposed to panic; never crash a reload if it does
			d.errs = append(d.errs, &Error{File: d.file, Line: 1, Msg: fmt.Sprintf("cannot parse YAML: %v", r)})
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		d.errs = append(d.errs, d.syntaxError(data, err))
		return nil
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		d.errf(&next, "", "only one YAML document is allowed (a second starts here)")
		return nil
	case !errors.Is(err, io.EOF):
		d.errs = append(d.errs, d.syntaxError(data, err))
		return nil
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0]
	}
	return nil
}

// syntaxError turns a yaml.v3 error into an Error with a line.
func (d *decoder) syntaxError(data []byte, err error) *Error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		if parserProblem(m[2]) {
			line++ // yaml.v3 prints a parser error's 0-based line as it is
		}
		// A problem found at the end of the input is placed after its
		// last line: blame the last line, which holds what is unfinished.
		line = min(line, lastLine(data))
		return &Error{File: d.file, Line: max(line, 1), Msg: "syntax error: " + m[2]}
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	line := 1
	// "unknown anchor 'x' referenced": point at the first *x.
	if a, ok := strings.CutPrefix(msg, "unknown anchor '"); ok {
		if i := strings.IndexByte(a, '\''); i >= 0 {
			if j := bytes.Index(data, []byte("*"+a[:i])); j >= 0 {
				line = lineOf(data, j)
			}
		}
	}
	return &Error{File: d.file, Line: line, Msg: "syntax error: " + msg}
}

// parserProblems are the problems of yaml.v3's parser (parserc.go), as
// opposed to its scanner's. yaml.v3 adds one to the 0-based line of a
// scanner error only (decode.go, parser.fail), so the line it prints for
// these is one too early. (It prints no line at all when the 0-based line
// is 0: syntaxError then says line 1, which is right.)
var parserProblems = []string{
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"did not find expected '-' indicator",
	"did not find expected <document start>",
	"did not find expected <stream-start>",
	"did not find expected key",
	"did not find expected node content",
	"found duplicate %TAG directive",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found undefined tag handle",
}

// parserProblem reports whether msg, a yaml.v3 problem without its line,
// comes from its parser: one of parserProblems, or decode.go's "expected
// <event> event but got <event>".
func parserProblem(msg string) bool {
	return slices.Contains(parserProblems, msg) || strings.HasPrefix(msg, "expected ") && strings.Contains(msg, " event but got ")
}

// lastLine returns the 1-based line of the last character of data, not
// counting a final line break (the line after it is empty).
func lastLine(data []byte) int {
	n := lineOf(data, len(data))
	switch r, _ := utf8.DecodeLastRune(data); r {
	case '\n', '\r', 0x85, 0x2028, 0x2029:
		n--
	}
	return max(n, 1)
}

// badText finds text yaml.v3 refuses without saying where: invalid UTF-8 and
// control characters.
func badText(data []byte) (line int, msg string) {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return lineOf(data, i), "file is not valid UTF-8"
		case r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r <= 0x7E || r == 0x85 || r == 0xFEFF,
			r >= 0xA0 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000:
		default:
			return lineOf(data, i), fmt.Sprintf("control character %U is not allowed", r)
		}
		i += size
	}
	return 0, ""
}

// lineOf returns the 1-based line of byte offset i, counting line breaks as
// YAML does: CR LF, CR, LF, NEL, LS and PS.
func lineOf(data []byte, i int) int {
	line := 1
	for j := 0; j < i; {
		r, size := utf8.DecodeRune(data[j:])
		switch r {
		case '\r':
			if j+1 < len(data) && data[j+1] == '\n' {
				size++
			}
			line++
		case '\n', 0x85, 0x2028, 0x2029:
			line++
		}
		j += size
	}
	return line
}

// config decodes the top-level mapping.
func (d *decoder) config(root *yaml.Node, c *Config) {
	d.object(root, "", fields{
		"listen": func(v *yaml.Node, p string) {
			if s, ok := d.str(v, p); ok && d.checkListen(v, p, s) {
				c.Listen = s
			}
		},
		"upstream":  func(v *yaml.Node, p string) { d.upstream(v, p, &c.Upstream) },
		"upstreams": func(v *yaml.Node, p string) { c.Upstreams = d.upstreams(v, p) },
		"auth":      func(v *yaml.Node, p string) { d.auth(v, p, &c.Auth) },
		"store":     func(v *yaml.Node, p string) { d.store(v, p, &c.Store) },
		"usage":     func(v *yaml.Node, p string) { d.usage(v, p, &c.Usage) },
		"default_tier": func(v *yaml.Node, p string) {
			c.DefaultTier, _ = d.str(v, p)
		},
		"tiers": func(v *yaml.Node, p string) { c.Tiers = d.tiers(v, p) },
		"global": func(v *yaml.Node, p string) {
			c.Global = d.rules(v, p, scopeGlobal)
		},
		"cache":    func(v *yaml.Node, p string) { d.cache(v, p, &c.Cache) },
		"tools":    func(v *yaml.Node, p string) { c.Tools = d.tools(v, p) },
		"breaker":  func(v *yaml.Node, p string) { d.breaker(v, p, &c.Breaker) },
		"server":   func(v *yaml.Node, p string) { d.server(v, p, &c.Server) },
		"sessions": func(v *yaml.Node, p string) { d.sessions(v, p, &c.Sessions) },
		"audit":    func(v *yaml.Node, p string) { d.audit(v, p, &c.Audit) },
	})
}

func (d *decoder) server(n *yaml.Node, path string, s *Server) {
	dur := func(dst *time.Duration) func(v *yaml.Node, p string) {
		return func(v *yaml.Node, p string) { *dst, _ = d.positiveDuration(v, p) }
	}
	d.object(n, path, fields{
		"read_header_timeout":     dur(&s.ReadHeaderTimeout),
		"read_timeout":            dur(&s.ReadTimeout),
		"idle_timeout":            dur(&s.IdleTimeout),
		"write_timeout":           dur(&s.WriteTimeout),
		"max_connections":         func(v *yaml.Node, p string) { s.MaxConnections, _ = d.positiveSmallCount(v, p) },
		"max_requests_per_tenant": func(v *yaml.Node, p string) { s.MaxRequestsPerTenant, _ = d.positiveSmallCount(v, p) },
		"allowed_origins": func(v *yaml.Node, p string) {
			d.list(v, p, func(_ int, v *yaml.Node, p string) {
				if o, ok := d.str(v, p); ok && d.checkOrigin(v, p, o) {
					s.AllowedOrigins = append(s.AllowedOrigins, o)
				}
			})
		},
	})
}

func (d *decoder) sessions(n *yaml.Node, path string, s *Sessions) {
	d.object(n, path, fields{
		"max_per_tenant":  func(v *yaml.Node, p string) { s.MaxPerTenant, _ = d.positiveSmallCount(v, p) },
		"max_per_subject": func(v *yaml.Node, p string) { s.MaxPerSubject, _ = d.positiveSmallCount(v, p) },
		"idle_timeout":    func(v *yaml.Node, p string) { s.IdleTimeout, _ = d.callDuration(v, p, true) },
	})
}

// jwtSources lists the key sources of auth.jwt in documentation order.
var jwtSources = []string{"hs256_secret_env", "jwks_url", "jwks_file", "public_key_file"}

func (d *decoder) auth(n *yaml.Node, path string, a *Auth) {
	j := &a.JWT
	var resourceAt, serversAt *yaml.Node
	str := func(dst *string) func(v *yaml.Node, p string) {
		return func(v *yaml.Node, p string) { *dst, _ = d.str(v, p) }
	}
	envName := func(dst *string) func(v *yaml.Node, p string) {
		return func(v *yaml.Node, p string) {
			if s, ok := d.str(v, p); ok && d.checkEnvName(v, p, s) {
				*dst = s
			}
		}
	}
	d.object(n, path, fields{
		"jwt": func(v *yaml.Node, p string) {
			d.object(v, p, fields{
				"hs256_secret_env": envName(&j.HS256SecretEnv),
				"jwks_url":         func(v *yaml.Node, p string) { j.JWKSURL = d.httpURL(v, p) },
				"jwks_file":        str(&j.JWKSFile),
				"public_key_file":  str(&j.PublicKeyFile),
				"issuer":           str(&j.Issuer),
				"audience":         str(&j.Audience),
				"tenant_claim":     str(&j.TenantClaim),
				"tier_claim":       str(&j.TierClaim),
				"scope_claim":      str(&j.ScopeClaim),
				"require_expiry": func(v *yaml.Node, p string) {
					if b, ok := d.bool(v, p); ok {
						j.RequireExpiry = b
						d.expirySet = true
					}
				},
				"require_subject": func(v *yaml.Node, p string) { j.RequireSubject, _ = d.bool(v, p) },
				"leeway": func(v *yaml.Node, p string) {
					if x, ok := d.duration(v, p); ok {
						if x < 0 || x > 5*time.Minute {
							d.errf(v, p, "must be between 0s and 5m, got %v", x)
							return
						}
						j.Leeway = x
						d.leewaySet = true
					}
				},
			})
		},
		"admin_token_env":    envName(&a.AdminTokenEnv),
		"session_secret_env": envName(&a.SessionSecretEnv),
		"authorization_servers": func(v *yaml.Node, p string) {
			a.AuthorizationServers, serversAt = d.authorizationServers(v, p), v
		},
		"resource": func(v *yaml.Node, p string) { a.Resource, resourceAt = d.resource(v, p), v },
	})
	d.checkResourceAlone(resourceAt, join(path, "resource"), a)
	d.checkAudienceUnbound(serversAt, join(path, "authorization_servers"), a)
}

func (d *decoder) store(n *yaml.Node, path string, s *Store) {
	d.object(n, path, fields{
		"redis":   func(v *yaml.Node, p string) { s.Redis = d.redis(v, p) },
		"timeout": func(v *yaml.Node, p string) { s.Timeout, _ = d.positiveDuration(v, p) },
		"on_error": func(v *yaml.Node, p string) {
			s.OnError = d.failurePolicy(v, p)
		},
	})
}

func (d *decoder) failurePolicy(v *yaml.Node, p string) FailurePolicy {
	s, ok := d.str(v, p)
	if !ok || s == "" {
		return ""
	}
	if fp := FailurePolicy(s); fp.Valid() {
		return fp
	}
	d.errf(v, p, "unknown failure policy %q (want one of open, closed, local)", s)
	return ""
}

func (d *decoder) usage(n *yaml.Node, path string, u *Usage) {
	d.object(n, path, fields{
		"store": func(v *yaml.Node, p string) {
			if s, ok := d.str(v, p); ok && d.checkUsageStore(v, p, s) {
				u.Store = s
			}
		},
		"flush_interval": func(v *yaml.Node, p string) { u.FlushInterval, _ = d.positiveDuration(v, p) },
	})
}

func (d *decoder) tiers(n *yaml.Node, path string) map[string]Tier {
	ps, _ := d.mapping(n, path)
	out := make(map[string]Tier, len(ps))
	for _, e := range ps {
		tp := join(path, e.name)
		if e.name == "" {
			d.errf(e.key, tp, "tier name is empty")
			continue
		}
		var t Tier
		d.object(e.val, tp, fields{
			"monthly_quota": func(v *yaml.Node, p string) { t.MonthlyQuota, _ = d.usageAmount(v, p, 0) },
			"limits": func(v *yaml.Node, p string) {
				t.Limits = d.rules(v, p, scopeTier)
				d.tierRules[e.name] = append(d.tierRules[e.name], d.lastRules...)
			},
			"deny_as": func(v *yaml.Node, p string) { t.DenyAs = d.denyAs(v, p) },
		})
		out[e.name] = t
	}
	return out
}

func (d *decoder) cache(n *yaml.Node, path string, c *Cache) {
	d.object(n, path, fields{
		"redis":       func(v *yaml.Node, p string) { c.Redis = d.redis(v, p) },
		"timeout":     func(v *yaml.Node, p string) { c.Timeout, _ = d.positiveDuration(v, p) },
		"max_entries": func(v *yaml.Node, p string) { c.MaxEntries, _ = d.positiveSmallCount(v, p) },
		"max_bytes": func(v *yaml.Node, p string) {
			if b, ok := d.positiveInt64(v, p); ok && b < minCacheBytes {
				d.errf(v, p, "must be at least %d (1 MiB: the in-process cache splits it over its shards), got %d", minCacheBytes, b)
			} else {
				c.MaxBytes = b
			}
		},
		"warm": func(v *yaml.Node, p string) {
			d.list(v, p, func(_ int, v *yaml.Node, p string) {
				w := Warm{Args: map[string]any{}}
				d.object(v, p, fields{
					"tool":   func(v *yaml.Node, p string) { w.Tool, _ = d.str(v, p) },
					"tenant": func(v *yaml.Node, p string) { w.Tenant, _ = d.str(v, p) },
					"args": func(v *yaml.Node, p string) {
						if v.Kind != yaml.MappingNode {
							d.errf(v, p, "want a mapping of argument names to values, got %s", describe(v))
							return
						}
						budget := maxArgNodes
						if a, ok := d.value(v, p, &budget); ok {
							w.Args = a.(map[string]any)
						}
					},
				})
				if v.Kind == yaml.MappingNode {
					c.Warm = append(c.Warm, w)
					d.warmAt = append(d.warmAt, warmRef{v, p})
				}
			})
		},
	})
}

func (d *decoder) tools(n *yaml.Node, path string) map[string]Tool {
	ps, _ := d.mapping(n, path)
	out := make(map[string]Tool, len(ps))
	for _, e := range ps {
		tp := join(path, e.name)
		if e.name == "" {
			d.errf(e.key, tp, "tool name is empty")
			continue
		}
		d.toolAt = append(d.toolAt, toolRef{e.name, fieldRef{e.key, tp}})
		t := Tool{Cost: Cost{Fixed: 1}}
		d.object(e.val, tp, fields{
			"cost": func(v *yaml.Node, p string) { d.cost(v, p, &t.Cost) },
			"cache": func(v *yaml.Node, p string) {
				tc := &ToolCache{}
				ttlSet := false
				d.object(v, p, fields{
					"ttl": func(v *yaml.Node, p string) {
						ttlSet = true
						tc.TTL, _ = d.positiveDuration(v, p)
					},
					"jitter":       func(v *yaml.Node, p string) { tc.Jitter, _ = d.percent(v, p) },
					"negative_ttl": func(v *yaml.Node, p string) { tc.NegativeTTL, _ = d.duration(v, p) },
					"shared":       func(v *yaml.Node, p string) { tc.Shared, _ = d.bool(v, p) },
					"tags":         func(v *yaml.Node, p string) { tc.Tags = d.tags(v, p) },
				})
				if !ttlSet && v.Kind == yaml.MappingNode {
					d.errf(v, join(p, "ttl"), "required (how long a result stays cached)")
				}
				t.Cache = tc
			},
			"on_error": func(v *yaml.Node, p string) { t.OnError = d.failurePolicy(v, p) },
			"limits": func(v *yaml.Node, p string) {
				t.Limits = d.rules(v, p, scopeTool)
				d.toolRules[e.name] = append(d.toolRules[e.name], d.lastRules...)
			},
			"invalidates": func(v *yaml.Node, p string) { t.Invalidates = d.tags(v, p) },
			"deny_as":     func(v *yaml.Node, p string) { t.DenyAs = d.denyAs(v, p) },
			"timeout": func(v *yaml.Node, p string) {
				var ok bool
				if t.Timeout, ok = d.callDuration(v, p, true); ok {
					d.toolTimeoutAt = append(d.toolTimeoutAt, fieldRef{v, p})
				}
			},
		})
		out[e.name] = t
	}
	return out
}

// cost decodes `cost: 3` or `cost: {estimate: 150, from_result: path}`.
func (d *decoder) cost(n *yaml.Node, path string, c *Cost) {
	if n.Kind == yaml.ScalarNode {
		if v, ok := d.usageAmount(n, path, 1); ok {
			*c = Cost{Fixed: v}
		}
		return
	}
	if n.Kind != yaml.MappingNode {
		d.errf(n, path, "want an integer or a mapping {estimate, from_result}, got %s", describe(n))
		return
	}
	out := Cost{Estimate: 1}
	fromSet := false
	d.object(n, path, fields{
		"estimate": func(v *yaml.Node, p string) {
			if x, ok := d.usageAmount(v, p, 1); ok {
				out.Estimate = x
			}
		},
		"from_result": func(v *yaml.Node, p string) {
			fromSet = true
			if s, ok := d.str(v, p); ok && d.checkResultPath(v, p, s) {
				out.FromResult = s
			}
		},
	})
	if !fromSet {
		d.errf(n, join(path, "from_result"), "required in the mapping form (write `cost: N` for a fixed cost)")
		return
	}
	if out.FromResult != "" {
		*c = out
	}
}

// breaker decodes the breaker section. max_cooldown is compared with
// cooldown once the whole mapping is read, whatever the order of the keys.
func (d *decoder) breaker(n *yaml.Node, path string, b *Breaker) {
	var maxCooldownAt *yaml.Node
	cooldownGiven := false
	threshold := func(dst *int) func(v *yaml.Node, p string) {
		return func(v *yaml.Node, p string) { *dst, _ = d.smallCount(v, p) }
	}
	d.object(n, path, fields{
		"key": func(v *yaml.Node, p string) {
			s, ok := d.str(v, p)
			switch {
			case !ok:
			case s == "subject" || s == "tenant" || s == "session" || s == "":
				b.Key = s
			default:
				d.errf(v, p, "unknown breaker key %q (want one of subject, tenant, session)", s)
			}
		},
		"consecutive_denials":  threshold(&b.ConsecutiveDenials),
		"consecutive_failures": threshold(&b.ConsecutiveFailures),
		"identical_calls": func(v *yaml.Node, p string) {
			ic := &b.IdenticalCalls
			withinGiven := false // a bad within is reported as such, not as missing
			d.object(v, p, fields{
				"count": threshold(&ic.Count),
				"within": func(v *yaml.Node, p string) {
					withinGiven = true
					ic.Within, _ = d.breakerDuration(v, p)
				},
			})
			if v.Kind != yaml.MappingNode {
				return
			}
			switch {
			case ic.Count == 1:
				d.errf(v, join(p, "count"), "must be at least 2 (1 would open the breaker on every call), or 0 to disable")
			case ic.Count > 1 && !withinGiven:
				d.errf(v, join(p, "within"), "required when count is set")
			}
		},
		"cooldown": func(v *yaml.Node, p string) {
			cooldownGiven = true // object skips a null, which keeps the default
			b.Cooldown, _ = d.breakerDuration(v, p)
		},
		"max_cooldown": func(v *yaml.Node, p string) {
			var ok bool
			if b.MaxCooldown, ok = d.breakerDuration(v, p); ok {
				maxCooldownAt = v
			}
		},
		"alert_webhook": func(v *yaml.Node, p string) { b.AlertWebhook = d.httpURL(v, p) },
	})
	// A cooldown left out is the default one, which the engine would
	// otherwise silently raise max_cooldown to. (A bad one is reported
	// as such: no comparison then.)
	cooldown, note := b.Cooldown, ""
	if cooldown == 0 && !cooldownGiven {
		cooldown, note = DefaultCooldown, ", the default"
	}
	if maxCooldownAt != nil && cooldown > 0 && b.MaxCooldown < cooldown {
		d.errf(maxCooldownAt, join(path, "max_cooldown"), "must not be shorter than cooldown (%v%s)", cooldown, note)
	}
}

// breakerDuration decodes a breaker duration: positive and at most
// limit.MaxBreakerDuration, beyond which the stores refuse the breaker, and
// with it every call it guards. (The engine rounds it up to whole
// milliseconds, the stores' unit, so any positive duration is long enough.)
func (d *decoder) breakerDuration(n *yaml.Node, path string) (time.Duration, bool) {
	v, ok := d.positiveDuration(n, path)
	if ok && v > limit.MaxBreakerDuration {
		d.errf(n, path, "must be at most %v (the longest a breaker keeps state), got %v", limit.MaxBreakerDuration, v)
		return 0, false
	}
	return v, ok
}

// maxCallDuration is the longest upstream.timeout, upstream.max_duration,
// upstreams[].timeout, tools.<name>.timeout and sessions.idle_timeout
// Parse accepts: limit.MaxPeriod, the longest window or lease the stores
// keep, so no slot or breaker lease derived from them can outgrow it. The
// engine and the gateway compute with these durations (the breaker's probe
// lease is 2*upstream.timeout+5s, the federation's session timeout twice
// sessions.idle_timeout): unbounded, the sums overflow time.Duration into
// negative values, and every call is then refused.
const maxCallDuration = limit.MaxPeriod

// callDuration decodes one of the durations bounded by maxCallDuration;
// positive says whether 0 is refused (it is not for max_duration, where it
// means no cap).
func (d *decoder) callDuration(n *yaml.Node, path string, positive bool) (time.Duration, bool) {
	decode := d.duration
	if positive {
		decode = d.positiveDuration
	}
	v, ok := decode(n, path)
	if ok && v > maxCallDuration {
		d.errf(n, path, "must be at most %v (the longest a lease or window is kept), got %v", maxCallDuration, v)
		return 0, false
	}
	return v, ok
}

// usageAmount decodes an amount of usage (a cost, an estimate, a quota):
// an integer from least (0 or 1) to limit.MaxUsage, the most a usage meter
// counts exactly; the stores refuse a larger one, and with it every call
// it meters.
func (d *decoder) usageAmount(n *yaml.Node, path string, least int64) (int64, bool) {
	v, ok := d.int64(n, path)
	switch {
	case !ok:
		return 0, false
	case v < least && least == 0:
		d.errf(n, path, "must not be negative, got %d", v)
	case v < least:
		d.errf(n, path, "must be at least %d, got %d", least, v)
	case v > limit.MaxUsage:
		d.errf(n, path, "must be at most %d (the most a usage meter counts), got %d", int64(limit.MaxUsage), v)
	default:
		return v, true
	}
	return 0, false
}

// defaults fills what the file left out.
func (d *decoder) defaults(c *Config) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Listen, DefaultListen)
	def(&c.DefaultTier, DefaultTierName)
	def(&c.Auth.JWT.TenantClaim, DefaultTenantClaim)
	def(&c.Auth.JWT.TierClaim, DefaultTierClaim)
	def(&c.Auth.JWT.ScopeClaim, DefaultScopeClaim)
	def((*string)(&c.Store.OnError), string(FailOpen))
	def(&c.Usage.Store, DefaultUsageStore)
	def(&c.Breaker.Key, "subject")
	if c.Upstream.Headers == nil {
		c.Upstream.Headers = map[string]string{}
	}
	if c.Upstream.MaxBodyBytes == 0 {
		c.Upstream.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Upstream.Timeout == 0 {
		c.Upstream.Timeout = DefaultUpstreamWait
	}
	for i := range c.Upstreams {
		if c.Upstreams[i].Timeout == 0 {
			c.Upstreams[i].Timeout = c.Upstream.Timeout
		}
	}
	if !d.expirySet {
		c.Auth.JWT.RequireExpiry = true
	}
	if !d.leewaySet {
		c.Auth.JWT.Leeway = DefaultLeeway
	}
	sv := &c.Server
	for _, f := range []struct {
		dst *time.Duration
		def time.Duration
	}{
		{&sv.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&sv.ReadTimeout, DefaultReadTimeout},
		{&sv.IdleTimeout, DefaultIdleTimeout}, {&sv.WriteTimeout, DefaultWriteTimeout},
		{&c.Sessions.IdleTimeout, DefaultSessionIdle},
	} {
		if *f.dst == 0 {
			*f.dst = f.def
		}
	}
	if sv.MaxConnections == 0 {
		sv.MaxConnections = DefaultMaxConnections
	}
	if sv.MaxRequestsPerTenant == 0 {
		sv.MaxRequestsPerTenant = tenantCapOf(sv.MaxConnections)
		sv.derivedTenantCap = sv.MaxRequestsPerTenant
	}
	if c.Sessions.MaxPerTenant == 0 {
		c.Sessions.MaxPerTenant = DefaultSessionsPerTenant
	}
	if c.Sessions.MaxPerSubject == 0 {
		c.Sessions.MaxPerSubject = min(DefaultSessionsPerSubj, c.Sessions.MaxPerTenant)
	}
	if c.Store.Timeout == 0 {
		c.Store.Timeout = DefaultStoreTimeout
	}
	if c.Cache.Timeout == 0 {
		c.Cache.Timeout = DefaultCacheTimeout
	}
	if c.Usage.FlushInterval == 0 {
		c.Usage.FlushInterval = DefaultFlushInterval
	}
	if c.Breaker.Cooldown == 0 {
		c.Breaker.Cooldown = DefaultCooldown
	}
	if c.Breaker.MaxCooldown == 0 {
		c.Breaker.MaxCooldown = max(DefaultMaxCooldown, c.Breaker.Cooldown)
	}
	if c.Tiers == nil {
		c.Tiers = map[string]Tier{}
	}
	if c.Tools == nil {
		c.Tools = map[string]Tool{}
	}
}
