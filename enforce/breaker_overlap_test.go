package enforce_test

import (
	"context"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
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
	shared := &slowFailureReport{GuardedStore: newSwappable(t), applied: make(chan struct{}), release: make(chan struct{})}
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 10s}
breaker:
  consecutive_failures: 2
  cooldown: 1h
`, enforce.Options{Shared: shared, Probe: func(context.Context) error { return nil }})
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
