package enforce_test

import (
	"context"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
)

// slowFailureReport holds the answer to the first failure report after the
// store applied it: the failure is counted, its reporter does not know yet.
type slowFailureReport struct {
	limit.GuardedStore
	applied, release chan struct{}
	once             sync.Once
}

func (s *slowFailureReport) ReportOutcome(ctx context.Context, b limit.BreakerSpec, failed, probe bool) (limit.BreakerState, error) {
	st, err := s.GuardedStore.ReportOutcome(ctx, b, failed, probe)
	if failed {
		s.once.Do(func() {
			close(s.applied)
			<-s.release
		})
	}
	return st, err
}

// A success reported while another call's failure report is on its way
// back resets the count all the same: fail, succeed, fail does not open a
// breaker of two consecutive failures, whatever the order of the answers.
func TestBreakerSuccessWhileAFailureReportIsInFlight(t *testing.T) {
	cfg, err := policy.Parse("x.yaml", []byte(`upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {timeout: 10s}
breaker:
  consecutive_failures: 2
  cooldown: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	shared := &slowFailureReport{GuardedStore: newSwappable(t), applied: make(chan struct{}), release: make(chan struct{})}
	e, err := enforce.New(enforce.Options{Config: cfg, Shared: shared, Probe: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "flaky"}
	admit := func() *enforce.Ticket { return mustAdmit(t, e, call) }
	a, b := admit(), admit()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Done(context.Background(), enforce.Outcome{Status: enforce.ToolError})
	}()
	<-shared.applied
	a.Done(context.Background(), enforce.Outcome{Status: enforce.OK})
	close(shared.release)
	<-done
	admit().Done(context.Background(), enforce.Outcome{Status: enforce.ToolError})
	if _, d := e.Admit(t.Context(), call); !d.Allowed {
		t.Fatalf("fail, succeed, fail opened a breaker of two consecutive failures: %+v", d)
	}
}
