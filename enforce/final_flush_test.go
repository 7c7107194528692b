package enforce_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
)

// On the in-process store, usage a failed final flush could not write is
// lost with the process (no other instance will sweep it): its calls are
// counted in mcpgate_unmetered_calls_total.
func TestFailedFinalFlushInProcessCountsUnmetered(t *testing.T) {
	cfg, err := policy.Parse("x.yaml", []byte(`upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
usage: {flush_interval: 1h}
tools:
  llm: {cost: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	us := &putFailing{Store: openSQLite(t)}
	m := metrics.New()
	e, err := enforce.New(enforce.Options{Config: cfg, Usage: us, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if n := admitN(t, e, 2, nil); n != 2 {
		t.Fatalf("%d calls admitted, want 2", n)
	}
	if err := e.Flusher().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	us.down.Store(true)
	if n := admitN(t, e, 3, nil); n != 3 {
		t.Fatalf("%d calls admitted, want 3", n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Unmetered); got != 3 {
		t.Errorf("unmetered calls = %v, want the 3 the failed final flush left in the in-process store", got)
	}
}
