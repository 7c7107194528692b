package usage_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/dynamodb"
)

var _ limit.MeteredStore = (*redisstore.Store)(nil)

// waitFlushed waits until every named meter's live usage is all flushed.
func waitFlushed(t *testing.T, ms limit.MeteredStore, d time.Duration, period string, tenants ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, tenant := range tenants {
		for s := live(t, ms, tenant, period); s.Flushed != s.Live; s = live(t, ms, tenant, period) {
			if time.Now().After(deadline) {
				t.Fatalf("meter of %s not flushed after %v: %+v", tenant, d, s)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Instances share a Redis: one charges and dies without flushing; the
// survivor's sweep (at Run's start) writes its usage, and the survivor's own
// usage of the same tenant adds to it exactly.
func TestRedisDeadInstance(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	newStore := func() *redisstore.Store {
		// no store timeout under test here: a loaded machine stalled a
		// read past the 25 ms default
		s, err := redisstore.New(r.Client(t), &redisstore.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	st := newSQLite(t, "")

	a := newStore() // the instance that dies
	fa := usage.NewFlusher(a, st, nil)
	for range 5 {
		charge(t, a, fa, fa, "acme", period, 3)
	}
	charge(t, a, fa, fa, "globex", period, 1)
	// fa never runs: the instance is gone before its first flush.

	b := newStore()
	fb := usage.NewFlusher(b, st, &usage.FlusherOptions{Interval: 20 * time.Millisecond, Logger: quiet()})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- fb.Run(ctx) }()
	waitFlushed(t, b, 5*time.Second, period, "acme", "globex")
	want(t, st, "acme", period, limit.Usage{Charged: 15, Calls: 5})

	for range 2 {
		charge(t, b, fb, fb, "acme", period, 3)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 21, Calls: 7})
	want(t, st, "globex", period, limit.Usage{Charged: 1, Calls: 1})

	// Redis loses the meter (FLUSHALL stands for a failover without
	// persistence): the next call re-seeds from the durable total.
	if err := r.Client(t).Do(t.Context(), r.Client(t).B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if got := charge(t, b, fb, fb, "acme", period, 3); got != (limit.Usage{Charged: 24, Calls: 8}) {
		t.Fatalf("re-seeded meter = %+v", got)
	}
	if err := fb.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 24, Calls: 8})
	if _, ok, err := b.ReadMeter(t.Context(), keyspace.Usage("acme", period)); err != nil || !ok {
		t.Fatalf("ReadMeter = %v, %v", ok, err)
	}
}

// DynamoDB (the emulator) is killed while calls go on, and restarted: Run
// keeps retrying and the totals land, exact.
func TestDynamoDBDownThenBack(t *testing.T) {
	d := testenv.StartDynaliteServer(t)
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", d.Endpoint)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_MAX_ATTEMPTS", "1") // the flusher retries; the SDK need not
	st, err := dynamodb.Open(t.Context(), "usage")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Init(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	ms := newMem(t, nil)
	f := usage.NewFlusher(ms, st, &usage.FlusherOptions{
		Interval: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Timeout: 2 * time.Second, Logger: quiet(),
	})
	charge(t, ms, f, f, "acme", period, 2)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	waitFlushed(t, ms, 5*time.Second, period, "acme")

	d.Kill(t)
	for range 4 {
		charge(t, ms, f, f, "acme", period, 2)
	}
	time.Sleep(150 * time.Millisecond) // a few failed rounds
	if s := live(t, ms, "acme", period); s.Flushed.Charged != 2 {
		t.Fatalf("flushed part moved while DynamoDB was down: %+v", s)
	}
	d.Restart(t)
	waitFlushed(t, ms, 10*time.Second, period, "acme")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 10, Calls: 5})
}
