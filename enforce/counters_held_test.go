package enforce_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
	"github.com/mcpgate/mcpgate/policy"
)

// heldConfig counts every tool, and every prompt a caller gets, per tenant.
const heldConfig = `upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1h}
      - {name: per_prompt, per: tenant_tool, methods: [prompts/get], algorithm: fixed_window, limit: 1, period: 1h}
`

// unlisting is the in-process store, whose listing of held counters fails.
type unlisting struct{ *memstore.Store }

var errListing = errors.New("listing refused")

func (unlisting) HeldCounters(context.Context, string) ([]string, error) { return nil, errListing }

func heldEngine(t *testing.T, local limit.GuardedStore) *enforce.Engine {
	t.Helper()
	cfg, err := policy.Parse("held.yaml", []byte(heldConfig))
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Local: local})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// Counters and a tenant's reset reach the per-tool counters of a tool and
// of a prompt the config does not list; naming one (as the admin view
// shows it: the tool, or "prompts/get NAME") resets that one alone.
func TestResetHeldCounters(t *testing.T) {
	t.Parallel()
	e := heldEngine(t, nil)
	ctx := t.Context()
	tool := enforce.Call{Tenant: "acme", Subject: "a", Name: "echo"}
	prompt := enforce.Call{Tenant: "acme", Subject: "a", Method: "prompts/get", Name: enforce.MethodTarget("prompts/get", "greeting")}
	admit := func(label string, c enforce.Call, want bool) {
		t.Helper()
		ticket, d := e.Admit(ctx, c)
		ticket.Done(ctx, enforce.Outcome{})
		if d.Allowed != want {
			t.Fatalf("%s: allowed %v, want %v (%+v)", label, d.Allowed, want, d)
		}
	}
	for _, c := range []enforce.Call{tool, prompt} {
		admit("first "+c.Name, c, true)
		admit("second "+c.Name, c, false)
	}
	cs, err := e.Counters(ctx, "free", "acme", "")
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]int64{}
	for _, c := range cs {
		shown[c.Rule.Name+"/"+c.Tool] = c.Result.Remaining
	}
	if r, ok := shown["per_tool/echo"]; !ok || r != 0 {
		t.Fatalf("counters %v: want per_tool/echo with 0 remaining", shown)
	}
	if r, ok := shown["per_prompt/prompts/get greeting"]; !ok || r != 0 {
		t.Fatalf("counters %v: want per_prompt/prompts/get greeting with 0 remaining", shown)
	}

	if _, n, err := e.ResetCounters(ctx, "acme", "", prompt.Name); err != nil || n != 1 {
		t.Fatalf("reset of the prompt: %d cleared, %v; want 1", n, err)
	}
	admit("the prompt after its reset", prompt, true)
	admit("the tool after the prompt's reset", tool, false)
	if _, n, err := e.ResetCounters(ctx, "acme", "", ""); err != nil || n != 2 {
		t.Fatalf("reset of the tenant: %d cleared, %v; want 2 (echo's and the prompt's)", n, err)
	}
	admit("the tool after the tenant's reset", tool, true)
}

// A store that cannot list what it holds: the counters the config names
// are read and reset all the same, and the error says the rest is missing.
func TestHeldCountersListingFails(t *testing.T) {
	t.Parallel()
	ms, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Close() })
	e := heldEngine(t, unlisting{ms})
	ctx := t.Context()
	cs, err := e.Counters(ctx, "free", "acme", "")
	if !errors.Is(err, enforce.ErrCountersIncomplete) || !errors.Is(err, errListing) || len(cs) == 0 {
		t.Fatalf("Counters: %d counters, %v; want the configured ones and ErrCountersIncomplete", len(cs), err)
	}
	if counters, _, err := e.ResetCounters(ctx, "acme", "", ""); !errors.Is(err, enforce.ErrCountersIncomplete) || counters == 0 {
		t.Fatalf("ResetCounters: %d counters, %v; want the configured ones reset and ErrCountersIncomplete", counters, err)
	}
}

// hanging is the in-process store, whose listing of held counters never
// answers (a node that does not): it ends with its context.
type hanging struct{ *memstore.Store }

func (hanging) HeldCounters(ctx context.Context, _ string) ([]string, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A listing that runs out of time leaves the calls after it theirs: under
// one deadline, the counters the config names are read and reset, and the
// answer says the rest is missing.
func TestHeldCountersListingTimesOut(t *testing.T) {
	t.Parallel()
	ms, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Close() })
	e := heldEngine(t, hanging{ms})
	tool := enforce.Call{Tenant: "acme", Subject: "a", Name: "echo"}
	ticket, d := e.Admit(t.Context(), tool)
	ticket.Done(t.Context(), enforce.Outcome{})
	if !d.Allowed {
		t.Fatal(d)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	cs, err := e.Counters(ctx, "free", "acme", "")
	if !errors.Is(err, enforce.ErrCountersIncomplete) || len(cs) == 0 {
		t.Fatalf("Counters: %d counters, %v; want the configured ones and ErrCountersIncomplete", len(cs), err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, _, err := e.ResetCounters(ctx, "acme", "", "echo"); err != nil {
		t.Fatalf("reset naming the tool (nothing to list): %v", err)
	}
	ticket, d = e.Admit(t.Context(), tool)
	ticket.Done(t.Context(), enforce.Outcome{})
	if !d.Allowed {
		t.Fatalf("echo after its reset: %+v", d)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if counters, _, err := e.ResetCounters(ctx, "acme", "", ""); !errors.Is(err, enforce.ErrCountersIncomplete) || counters == 0 {
		t.Fatalf("tenant reset: %d counters, %v; want the configured ones reset and ErrCountersIncomplete", counters, err)
	}
}
