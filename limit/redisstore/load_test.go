package redisstore

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
)

// Load puts the library on the server before the first call, so that the
// first call is an FCALL that finds it (no "Function not found" round trip,
// no load within the call's timeout); with NoFunctions it does nothing.
func TestLoad(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t, nil)
	c := r.Client(t)
	checks := tenantChecks("acme", limit.Rule{Name: "r", Algorithm: limit.FixedWindow, Limit: 10, Period: time.Minute})

	s := newStore(t, c, testTimeout)
	if err := s.Load(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if loads, _ := commandCalls(t, c, "function|load"); loads != 1 {
		t.Fatalf("FUNCTION LOAD calls after Load: %d, want 1", loads)
	}
	taker(t, ctxT(t), s, checks)()
	if loads, _ := commandCalls(t, c, "function|load"); loads != 1 {
		t.Fatalf("FUNCTION LOAD calls after the first call: %d, want still 1", loads)
	}
	if calls, failed := commandCalls(t, c, "fcall"); calls != 1 || failed != 0 {
		t.Fatalf("FCALL calls %d (failed %d), want 1 that found the function", calls, failed)
	}

	scripts := newStoreOpts(t, c, &Options{Timeout: testTimeout, NoFunctions: true})
	if err := scripts.Load(ctxT(t)); err != nil {
		t.Fatalf("Load with NoFunctions: %v", err)
	}
	if loads, _ := commandCalls(t, c, "function|load"); loads != 1 {
		t.Fatalf("Load with NoFunctions sent FUNCTION LOAD (%d calls in all)", loads)
	}
}
