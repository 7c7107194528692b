package enforce_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/dynamodb"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// invalidTenants are tenant ids the Engine cannot meter or bill: an
// identity function of an adapter (gosdk) may return any of them, though
// the gateway's authentication refuses them all at the token.
var invalidTenants = map[string]string{
	// Its usage could be stored nowhere: the final flush would report
	// success with the calls billed to no one.
	"empty": "",
	// A store's encoding replaces invalid bytes (DynamoDB: with U+FFFD),
	// so the two would be billed as one tenant.
	"invalid UTF-8":     "acme\xff",
	"invalid UTF-8 too": "acme\xfe",
	// DynamoDB refuses a key over 2048 bytes, for ever, as if it were down.
	"too long":          strings.Repeat("t", usage.MaxTenantBytes+1),
	"control character": "ac\nme",
}

// A call naming an invalid tenant is refused before anything is counted or
// charged, whatever its method, with Decision.Invalid wrapping
// ErrInvalidTenant; valid tenants, the longest included, are metered as
// before.
func TestAdmitRefusesInvalidTenants(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	e := engines(t, "memory", 1, "tools:\n  llm: {cost: 3}\n", path)[0]
	for name, tenant := range invalidTenants {
		if err := enforce.CheckTenant(tenant); !errors.Is(err, enforce.ErrInvalidTenant) {
			t.Errorf("CheckTenant(%s) = %v, want ErrInvalidTenant", name, err)
		}
		for _, method := range []string{"", policy.MethodInitialize, "tools/list"} {
			tk, d := e.Admit(t.Context(), enforce.Call{Tenant: tenant, Subject: "s", Method: method, Name: "llm"})
			if d.Allowed || d.Unavailable || !errors.Is(d.Invalid, enforce.ErrInvalidTenant) {
				t.Errorf("Admit(%s, method %q): allowed %v, unavailable %v, invalid %v; want refused with ErrInvalidTenant", name, method, d.Allowed, d.Unavailable, d.Invalid)
			}
			if decision, _, _ := d.Describe(); decision != "invalid" {
				t.Errorf("Admit(%s, method %q) is described as %q, want invalid", name, method, decision)
			}
			slots := tk.SessionSlots()
			if charged := tk.Done(t.Context(), enforce.Outcome{}); slots != (enforce.SessionSlots{}) || charged != 0 {
				t.Errorf("refused call of %s, method %q: Done charged %d, session slots taken %v", name, method, charged, slots != (enforce.SessionSlots{}))
			}
			slots.Release(t.Context())
		}
	}
	longest := strings.Repeat("é", usage.MaxTenantBytes/2)
	for _, tenant := range []string{"acme", longest} {
		tk, d := e.Admit(t.Context(), enforce.Call{Tenant: tenant, Subject: "s", Name: "llm"})
		if !d.Allowed || d.Invalid != nil {
			t.Fatalf("Admit(%.20q) = %+v, want admitted", tenant, d)
		}
		tk.Done(t.Context(), enforce.Outcome{})
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close (final flush): %v", err)
	}

	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	period := usage.Period(time.Now())
	for _, tenant := range []string{"acme", longest} {
		if rec, ok, err := s.Get(t.Context(), tenant, period); err != nil || !ok || rec.Calls != 1 || rec.Charged != 3 {
			t.Errorf("tenant %.20q: durable usage %+v (ok %v, err %v), want 1 call charged 3", tenant, rec.Usage, ok, err)
		}
	}
	for name, tenant := range invalidTenants {
		if rec, ok, err := s.Get(t.Context(), tenant, period); ok || err != nil {
			t.Errorf("tenant %s: durable usage %+v (ok %v, err %v), want none", name, rec.Usage, ok, err)
		}
	}
}

var dynamoTables atomic.Int64

// On DynamoDB, whose encoding turns invalid UTF-8 into U+FFFD, tenants
// whose ids differ only in invalid bytes are refused rather than billed
// together, and so is the tenant they would have been merged into (U+FFFD
// is what a decoder makes of invalid input: ident.Check): nothing is
// billed.
func TestInvalidUTF8TenantsAreNotBilledTogether(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", testenv.StartDynalite(t))
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	us, err := dynamodb.Open(t.Context(), fmt.Sprintf("usage_tenant_%d", dynamoTables.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := us.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	cfg, err := policy.Parse("tenant_test.yaml", []byte("upstream: {url: \"http://127.0.0.1:1/mcp\"}\nauth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}\ntools:\n  llm: {cost: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Usage: us})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	calls := map[string]int{"acme\xff": 5, "acme\xfe": 2, "acme\uFFFD": 1}
	for tenant, n := range calls {
		for range n {
			tk, d := e.Admit(t.Context(), enforce.Call{Tenant: tenant, Subject: "s", Name: "llm"})
			tk.Done(t.Context(), enforce.Outcome{})
			if d.Allowed || !errors.Is(d.Invalid, enforce.ErrInvalidTenant) {
				t.Fatalf("Admit(%q): allowed %v, invalid %v; want it refused as an invalid tenant", tenant, d.Allowed, d.Invalid)
			}
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := us.Get(t.Context(), "acme\uFFFD", usage.Period(time.Now()))
	if err != nil || ok {
		t.Fatalf("no call was admitted; DynamoDB bills %q %+v (ok %v, err %v)", "acme\uFFFD", rec.Usage, ok, err)
	}
}
