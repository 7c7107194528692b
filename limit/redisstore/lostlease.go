package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// lostLeases releases the concurrency slots of calls that failed: a script
// sent before its caller's deadline passed may still run on the server
// (its reply lost, the server stalled or failing over), and it then takes
// slots under a lease the caller never learnt. Nobody would release them:
// they would stay taken for the rule's whole period, refusing calls that
// should run. Releasing a lease that took nothing changes nothing.
type lostLeases struct {
	wg   sync.WaitGroup
	ctx  context.Context // ended by Close
	stop context.CancelFunc
}

func (l *lostLeases) init() { l.ctx, l.stop = context.WithCancel(context.Background()) }

// close stops the releases under way and waits for them.
func (l *lostLeases) close() {
	l.stop()
	l.wg.Wait()
}

// releaseLost frees, in the background, the slots a call that failed may
// have taken under lease: at once, and again after twice the store's
// timeout, for a script the server ran only after the first release (on
// another connection, or after a pause). Each set of checks is released
// on its own (a Cluster request's tenant and global checks are in
// different slots).
func (s *Store) releaseLost(lease string, sets ...[]limit.Check) {
	if lease == "" {
		return
	}
	var tries []func(context.Context) error
	for _, checks := range sets {
		var cs []limit.Check
		for _, c := range checks {
			if c.Rule.Algorithm == limit.Concurrency {
				cs = append(cs, c)
			}
		}
		if len(cs) == 0 {
			continue
		}
		tries = append(tries, func(ctx context.Context) error {
			err := s.Release(ctx, cs, lease)
			if err != nil {
				s.log.Debug("redisstore: the slots of a failed call are not released yet; they free themselves when the lease expires", "lease", lease, "err", err)
			}
			return err
		})
	}
	if len(tries) == 0 {
		return
	}
	// At once, and once more after twice the timeout (never 0).
	s.retryLost(0, func(wait time.Duration, _ error) (time.Duration, bool) {
		return 2 * s.timeout, wait == 0
	}, tries...)
}

// retryLost runs in the background, in rounds, the tries of a write whose
// outcome is unknown (a reply lost, a send failed): each round waits wait
// (first for the first round), then runs every try with a context of its
// own bounded by the store's timeout, so one hung try does not eat the
// others'. next sees the round's wait and its error (the tries' joined,
// nil when all succeeded) and says whether to run another round, and
// after which wait. Closing the store ends the rounds; Close waits for
// them.
func (s *Store) retryLost(first time.Duration, next func(wait time.Duration, err error) (time.Duration, bool), tries ...func(ctx context.Context) error) {
	l := &s.lost
	l.wg.Go(func() {
		for wait, more := first, true; more; {
			select {
			case <-l.ctx.Done():
				return
			case <-time.After(wait):
			}
			errs := make([]error, 0, len(tries))
			for _, try := range tries {
				ctx, cancel := context.WithTimeout(l.ctx, s.timeout)
				errs = append(errs, try(ctx))
				cancel()
			}
			wait, more = next(wait, errors.Join(errs...))
		}
	})
}
