package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
)

// namedClient is a client of r whose connections carry name in CLIENT LIST.
func namedClient(t *testing.T, r *testenv.Redis, name string) rueidis.Client {
	t.Helper()
	opt := r.ClientOption()
	opt.ClientName = name
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// fcallConns counts the connections named name whose last command was the
// store's FCALL, and all those named name.
func fcallConns(t *testing.T, admin rueidis.Client, name string) (fcall, all int) {
	t.Helper()
	list, err := admin.Do(context.Background(), admin.B().ClientList().Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(list) {
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		all++
		if strings.Contains(line, " cmd=fcall ") {
			fcall++
		}
	}
	return fcall, all
}

// A call made alone goes on a connection of its own (rueidis writes and
// reads it on the caller's goroutine); calls made together share the
// client's pipeline. Both count against the same limit, exactly.
func TestLoneCallsUseADedicatedConnection(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	admin := r.Client(t)
	// No keeper PING while the test reads which command each connection
	// ran last.
	s := newStoreOpts(t, namedClient(t, r, "store"), &Options{Timeout: time.Second, soloKeep: time.Hour})
	ctx := ctxT(t)
	const limitN = 60
	checks := tenantChecks("solo", rule("fw", limit.FixedWindow, limitN, time.Hour))
	take := func() bool {
		res, err := s.Take(ctx, checks, 1)
		if err != nil {
			t.Error(err)
			return false
		}
		return res.Allowed
	}

	testenv.Eventually(t, 15*time.Second, "the lone calls' connection to be ready", s.soloConn.ready.Load)
	if _, all := fcallConns(t, admin, "store"); all != 2 {
		t.Fatalf("%d connections before any call, want 2 (the pipeline's and the lone calls')", all)
	}
	for range 10 {
		if !take() {
			t.Fatal("a lone call under the limit was denied")
		}
	}
	fcall, all := fcallConns(t, admin, "store")
	if all != 2 || fcall != 1 {
		t.Fatalf("after 10 lone calls: %d connections, %d of them last ran FCALL; want 2 and 1 (the pipeline, idle, and one dedicated)", all, fcall)
	}

	// Together: the pipeline serves most of them (a call that happens to
	// find no other under way still goes alone).
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 10
	for range 16 {
		wg.Go(func() {
			for range 10 {
				if take() {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	// rueidis may open more than one pipeline connection (PipelineMultiplex).
	if fcall, _ := fcallConns(t, admin, "store"); fcall < 2 {
		t.Errorf("after concurrent calls, %d connection(s) last ran FCALL; want the pipeline's too", fcall)
	}
	if admitted != limitN {
		t.Fatalf("%d calls admitted under a limit of %d", admitted, limitN)
	}
	if take() {
		t.Fatal("a lone call over the limit was admitted")
	}
}

// On a server that accepts connections but answers nothing, every lone call
// still returns at its deadline: after the first, whose dedicated connection
// is closed for want of an answer, they take the pipeline with a hard
// deadline (a new connection, dedicated or the pipeline's, would wait for
// its dial, whatever the deadline), while a new one is dialled in the
// background. Once the server answers again, lone calls go back to a
// connection of their own.
func TestLoneCallsOnAStalledServerKeepTheirDeadline(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--enable-debug-command", "yes"}})
	other := r.Client(t)
	const timeout = 100 * time.Millisecond
	s := newStore(t, r.Client(t), timeout)
	ctx := ctxT(t)
	checks := tenantChecks("stall", rule("tb", limit.TokenBucket, 1000, time.Second))
	testenv.Eventually(t, 15*time.Second, "the lone calls' connection to be ready", s.soloConn.ready.Load)
	warmUp(t, func() error { _, err := s.Take(ctx, checks, 1); return err })

	stalled := make(chan error, 1)
	go func() {
		stalled <- other.Do(ctx, other.B().Arbitrary("DEBUG", "SLEEP").Args("2").Build()).Error()
	}()
	time.Sleep(200 * time.Millisecond) // let DEBUG SLEEP start
	for i := range 4 {
		began := time.Now()
		_, err := s.Take(ctx, checks, 1)
		elapsed := time.Since(began)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d on a stalled server: %v, want context.DeadlineExceeded", i, err)
		}
		// The bound is loose (2 shared cores); a dial would take the rest
		// of the 2 s stall.
		if elapsed > timeout+400*time.Millisecond {
			t.Errorf("call %d returned after %v, want about %v", i, elapsed, timeout)
		}
	}
	if s.soloConn.ready.Load() {
		t.Error("lone calls still take a dedicated connection on a stalled server")
	}
	if err := <-stalled; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	// Calls pass again (a loaded machine can stall the first past 100 ms).
	testenv.Eventually(t, 15*time.Second, "a Take to succeed after the stall", func() bool {
		_, err := s.Take(ctx, checks, 1)
		return err == nil
	})
	testenv.Eventually(t, 15*time.Second, "a new connection for lone calls", s.soloConn.ready.Load)
	s.Close()
	if s.soloConn.ready.Load() {
		t.Error("lone calls take a dedicated connection after Close")
	}
	if _, err := s.Take(ctx, checks, 1); err != nil {
		t.Fatalf("Take after Close: %v", err)
	}
}

// The keeper finds the idle connection of lone calls dead (here killed by
// the server) by its PING and dials a new one before any call needs it.
func TestKeeperReplacesAKilledConnection(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	admin := r.Client(t)
	s := newStoreOpts(t, namedClient(t, r, "store"), &Options{Timeout: time.Second, soloKeep: 20 * time.Millisecond})
	testenv.Eventually(t, 15*time.Second, "the lone calls' connection to be ready", s.soloConn.ready.Load)
	ctx := ctxT(t)
	if err := admin.Do(ctx, admin.B().Arbitrary("CLIENT", "KILL", "USER", "default").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// No call is made: only the keeper dials (rueidis redials its pipeline
	// at the next call).
	testenv.Eventually(t, 15*time.Second, "a new connection, dialled by the keeper", func() bool {
		_, all := fcallConns(t, admin, "store")
		return all >= 1 && s.soloConn.ready.Load()
	})
	checks := tenantChecks("kill", rule("fw", limit.FixedWindow, 10, time.Hour))
	if _, err := s.Take(ctx, checks, 1); err != nil {
		t.Fatalf("lone call after the kill: %v", err)
	}
}
