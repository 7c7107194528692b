package policy

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
)

func TestRulesForMethod(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head+`
tiers:
  free:
    limits:
      - {name: calls, algorithm: fixed_window, limit: 5, period: 1m}
      - {name: lists, methods: [tools/list, prompts/list], algorithm: fixed_window, limit: 3, period: 1m}
      - {name: everything, methods: ["*"], algorithm: fixed_window, limit: 100, period: 1m}
  bare: {}
  chatty:
    limits:
      - {name: notes, methods: [notifications, ping], algorithm: fixed_window, limit: 9, period: 1m}
global:
  - {name: all, algorithm: fixed_window, limit: 1000, period: 1m}
  - {name: inits, methods: [initialize], algorithm: fixed_window, limit: 50, period: 1m}
  - {name: every_request, methods: ["*"], algorithm: fixed_window, limit: 5000, period: 1m}
  - {name: all_notes, methods: [notifications], algorithm: fixed_window, limit: 7000, period: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	names := func(rs []Rule) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name)
		}
		return out
	}
	for _, tc := range []struct {
		tier, method   string
		tenant, global []string
	}{
		{"free", "tools/call", []string{"calls", "everything"}, []string{"all", "every_request"}},
		{"free", "tools/list", []string{"lists", "everything"}, []string{"every_request"}},
		{"free", "initialize", []string{"everything"}, []string{"inits", "every_request"}},
		{"free", "x/custom", []string{"everything"}, []string{"every_request"}},
		// "*" selects requests only: notifications have a budget of their own
		{"free", MethodNotifications, []string{"default_notifications"}, []string{"all_notes"}},
		{"bare", "initialize", []string{"default_initialize"}, []string{"inits", "every_request"}},
		{"bare", "ping", []string{"default_requests"}, []string{"every_request"}},
		{"bare", "x/custom", []string{"default_requests"}, []string{"every_request"}},
		{"bare", "tools/call", nil, []string{"all", "every_request"}},
		{"bare", MethodNotifications, []string{"default_notifications"}, []string{"all_notes"}},
		{"chatty", MethodNotifications, []string{"notes"}, []string{"all_notes"}},
		{"chatty", "ping", []string{"notes"}, []string{"every_request"}},
		{"chatty", "tools/list", []string{"default_requests"}, []string{"every_request"}},
	} {
		var tr, gr []Rule
		if tc.method == MethodToolsCall {
			tr, gr = c.RulesFor(tc.tier, "t")
		} else {
			tr, gr = c.RulesForMethod(tc.tier, tc.method)
		}
		if got := names(tr); !reflect.DeepEqual(got, tc.tenant) {
			t.Errorf("%s %s: tenant rules %q, want %q", tc.tier, tc.method, got, tc.tenant)
		}
		if got := names(gr); !reflect.DeepEqual(got, tc.global) {
			t.Errorf("%s %s: global rules %q, want %q", tc.tier, tc.method, got, tc.global)
		}
	}
	if r, _ := c.RulesForMethod("bare", "initialize"); r[0].Per != keyspace.PerTenant {
		t.Errorf("default initialize rule per %s", r[0].Per)
	}
}

func TestMethodsRefused(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"tiers: {free: {limits: [{name: a, methods: [Tools/call], algorithm: fixed_window, limit: 1, period: 1m}]}}", `unknown MCP request method "Tools/call"`},
		{"tiers: {free: {limits: [{name: a, methods: [], algorithm: fixed_window, limit: 1, period: 1m}]}}", "empty"},
		{"tiers: {free: {limits: [{name: a, methods: [ping, ping], algorithm: fixed_window, limit: 1, period: 1m}]}}", "listed twice"},
		{"tools: {t: {limits: [{name: a, methods: [ping], algorithm: fixed_window, limit: 1, period: 1m}]}}", "not allowed in a tool's rules"},
		{"server: {allowed_origins: [\"http://a.example/path\"]}", "bad origin"},
		{"server: {max_connections: 0}", "at least 1"},
		{"sessions: {max_per_subject: 0}", "at least 1"},
		{"auth: {jwt: {hs256_secret_env: SECRET, leeway: 10m}}", "between 0s and 5m"},
	} {
		doc := head + tc.doc + "\n"
		if strings.HasPrefix(tc.doc, "auth:") {
			doc = "upstream: {url: http://127.0.0.1:9000/mcp}\n" + tc.doc + "\n"
		}
		_, err := Parse("m.yaml", []byte(doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.doc, err, tc.want)
		}
	}
}

func TestServerSessionsAuthFields(t *testing.T) {
	c, err := Parse("m.yaml", []byte(`upstream: {url: http://127.0.0.1:9000/mcp, timeout: 5s, max_duration: 1h}
auth: {jwt: {hs256_secret_env: SECRET, require_expiry: false, require_subject: true, leeway: 0s}}
server: {read_timeout: 5s, idle_timeout: 7s, write_timeout: 9s, read_header_timeout: 2s, max_connections: 64,
  allowed_origins: ["https://app.example.com", "*"]}
sessions: {max_per_tenant: 20, max_per_subject: 4, idle_timeout: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	wantS := Server{ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 5 * time.Second, IdleTimeout: 7 * time.Second,
		WriteTimeout: 9 * time.Second, MaxConnections: 64, MaxRequestsPerTenant: 16, AllowedOrigins: []string{"https://app.example.com", "*"},
		derivedTenantCap: 16}
	if !reflect.DeepEqual(c.Server, wantS) {
		t.Errorf("server = %+v", c.Server)
	}
	if c.Sessions != (Sessions{MaxPerTenant: 20, MaxPerSubject: 4, IdleTimeout: time.Minute}) {
		t.Errorf("sessions = %+v", c.Sessions)
	}
	j := c.Auth.JWT
	if j.RequireExpiry || !j.RequireSubject || j.Leeway != 0 {
		t.Errorf("jwt = %+v", j)
	}
	if c.Upstream.MaxDuration != time.Hour || c.Upstream.Timeout != 5*time.Second {
		t.Errorf("upstream = %+v", c.Upstream)
	}
}

func TestMaxRequestsPerTenant(t *testing.T) {
	c, err := Parse("m.yaml", []byte("upstream: {url: http://127.0.0.1:9000/mcp}\nauth: {jwt: {hs256_secret_env: SECRET}}\nserver: {max_requests_per_tenant: 3}\n"))
	if err != nil || c.Server.MaxRequestsPerTenant != 3 {
		t.Fatalf("explicit cap: %v %v", c, err)
	}
	_, err = Parse("m.yaml", []byte("upstream: {url: http://127.0.0.1:9000/mcp}\nauth: {jwt: {hs256_secret_env: SECRET}}\nserver: {max_requests_per_tenant: 0}\n"))
	if err == nil || !strings.Contains(err.Error(), "m.yaml:3: server.max_requests_per_tenant: must be at least 1, got 0") {
		t.Fatalf("a cap of 0: %v", err)
	}
}

// WithMaxConnections puts in the connection cap a reload keeps: the
// per-tenant cap follows it when the file left it out, and stays as
// written otherwise.
func TestWithMaxConnections(t *testing.T) {
	parse := func(server string) Server {
		t.Helper()
		c, err := Parse("m.yaml", []byte("upstream: {url: http://127.0.0.1:9000/mcp}\nauth: {jwt: {hs256_secret_env: SECRET}}\nserver: "+server+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c.Server
	}
	if s := parse("{max_connections: 4096}").WithMaxConnections(8); s.MaxConnections != 8 || s.MaxRequestsPerTenant != 2 {
		t.Errorf("derived cap: %d connections, %d per tenant; want 8, 2", s.MaxConnections, s.MaxRequestsPerTenant)
	}
	if s := parse("{max_connections: 4096, max_requests_per_tenant: 100}").WithMaxConnections(8); s.MaxConnections != 8 || s.MaxRequestsPerTenant != 100 {
		t.Errorf("written cap: %d connections, %d per tenant; want 8, 100", s.MaxConnections, s.MaxRequestsPerTenant)
	}
	s := parse("{max_connections: 4096}")
	s.MaxRequestsPerTenant = 3 // set in code after Parse
	if s = s.WithMaxConnections(8); s.MaxRequestsPerTenant != 3 {
		t.Errorf("cap set in code: %d per tenant; want 3", s.MaxRequestsPerTenant)
	}
	if s := parse("{max_connections: 4096}").WithMaxConnections(8).WithMaxConnections(400); s.MaxRequestsPerTenant != 100 {
		t.Errorf("derived cap after two reloads: %d per tenant; want 100", s.MaxRequestsPerTenant)
	}
}
