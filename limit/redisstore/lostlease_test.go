package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
)

// A take sent before its caller's deadline that runs on the server only
// afterwards (the server stalled) takes a concurrency slot under a lease
// its caller never learnt: the store releases it, so the slot does not
// stay taken for the rule's period.
func TestLostLeaseIsReleased(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--enable-debug-command", "yes"}})
	c, sleeper, prober := r.Client(t), r.Client(t), r.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	checks := tenantChecks("lost-lease", limit.Rule{Name: "one", Algorithm: limit.Concurrency, Limit: 1, Period: time.Hour})
	d, err := s.Take(ctx, checks, 1) // the library loaded
	if err != nil || !d.Allowed {
		t.Fatalf("first take: %+v %v", d, err)
	}
	if err := s.Release(ctx, checks, d.Lease); err != nil {
		t.Fatal(err)
	}
	// The server sleeps for a second; once it no longer answers a PING,
	// a take is sent with a deadline it cannot meet. A loaded machine may
	// be slow to answer the PING without sleeping yet: then the take is
	// answered, and the round is tried again.
	for round := 0; ; round++ {
		slept := make(chan error, 1)
		go func() {
			slept <- sleeper.Do(ctx, sleeper.B().Arbitrary("DEBUG", "SLEEP").Args("1").Build()).Error()
		}()
		for {
			pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			err := prober.Do(pctx, prober.B().Ping().Build()).Error()
			cancel()
			if err != nil {
				break // asleep
			}
			time.Sleep(5 * time.Millisecond)
		}
		tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		d, err := s.Take(tctx, checks, 1)
		cancel()
		if err := <-slept; err != nil {
			t.Fatal(err)
		}
		if err != nil {
			break // the take is waiting in the sleeping server
		}
		if round == 5 {
			t.Fatal("no take met the sleeping server")
		}
		if err := s.Release(ctx, checks, d.Lease); err != nil {
			t.Fatal(err)
		}
	}
	// The server has run the take: its slot must come free again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := c.Do(ctx, c.B().Zcard().Key(checks[0].Key).Build()).AsInt64()
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lost call's slot is still taken (%d leases, %v): it would be for the rule's hour", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d, err := s.Take(ctx, checks, 1); err != nil || !d.Allowed {
		t.Fatalf("a take with no call in flight: %+v, %v", d, err)
	}
}

// retryLost runs its rounds as next schedules them, each try with a
// context of its own bounded by the store's timeout, tells next the round's
// joined error (nil when every try succeeded), and stops when the store
// closes, Close waiting for it.
func TestRetryLost(t *testing.T) {
	errFail := errors.New("fail")
	for _, tc := range []struct {
		name     string
		results  []error // of the two tries, round after round
		rounds   int     // next stops after this many rounds whatever the results
		wantRuns int
		wantErrs []bool // whether next saw an error, per round
	}{
		{"one round that succeeds", []error{nil, nil}, 1, 1, []bool{false}},
		{"every round runs whatever the outcome", []error{nil, nil, nil, nil, nil, nil}, 3, 3, []bool{false, false, false}},
		{"a failed try fails the round", []error{nil, errFail, errFail, nil, nil, nil}, 3, 3, []bool{true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{timeout: time.Hour, log: slog.New(slog.DiscardHandler)}
			s.lost.init()
			var (
				mu     sync.Mutex
				runs   int
				sawErr []bool
				ctxs   []context.Context
				result = tc.results
			)
			try := func(ctx context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > s.timeout {
					t.Errorf("a try's deadline is %v (%v), want one within the store's timeout", dl, ok)
				}
				ctxs = append(ctxs, ctx)
				err := result[0]
				result = result[1:]
				return err
			}
			s.retryLost(0, func(wait time.Duration, err error) (time.Duration, bool) {
				mu.Lock()
				defer mu.Unlock()
				runs++
				sawErr = append(sawErr, err != nil)
				if err != nil && !errors.Is(err, errFail) {
					t.Errorf("round %d: next saw %v, want the try's error", runs, err)
				}
				return 0, runs < tc.rounds
			}, try, try)
			s.lost.wg.Wait()
			s.Close()
			if runs != tc.wantRuns || !slices.Equal(sawErr, tc.wantErrs) {
				t.Errorf("%d rounds, errors seen %v; want %d, %v", runs, sawErr, tc.wantRuns, tc.wantErrs)
			}
			if len(ctxs) != 2*tc.wantRuns || len(ctxs) > 1 && ctxs[0] == ctxs[1] {
				t.Errorf("%d tries, want %d each with its own context", len(ctxs), 2*tc.wantRuns)
			}
		})
	}
	t.Run("the store closes", func(t *testing.T) {
		s := &Store{timeout: time.Hour, log: slog.New(slog.DiscardHandler)}
		s.lost.init()
		tried := make(chan struct{})
		s.retryLost(0, func(time.Duration, error) (time.Duration, bool) {
			return time.Hour, true
		}, func(context.Context) error {
			close(tried) // a second round would panic
			return errFail
		})
		<-tried
		s.Close() // returns: the round waiting an hour ends
	})
}
