package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// solo sends cmd on a connection of its own when it is the store's only
// call under way and that connection is ready, and through the client's
// shared pipeline otherwise.
//
// rueidis pipelines concurrent calls on one connection, which is what keeps
// the store fast under load. But once that connection has seen concurrent
// calls, every call is handed to rueidis's writer goroutine and its reply
// back from the reader goroutine: wake-ups that a call made alone pays in
// latency, about 100 µs per decision on a busy two-core host
// (docs/benchmarks.md, F.3). On a dedicated connection rueidis writes and
// reads on the caller's goroutine, as go-redis does. Only a call that finds
// no other under way takes it, so no two calls ever share it, and calls
// under load keep the pipeline. On it a call ends at its deadline, as on
// the pipeline, but a cancelled caller waits for the deadline too (the
// store's timeout at most).
func (s *Store) solo(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	defer s.inflight.Add(-1)
	if s.inflight.Add(1) != 1 || !s.soloConn.ready.Load() {
		return s.client.Do(ctx, cmd)
	}
	dc, release := s.client.Dedicate()
	r := dc.Do(ctx, cmd)
	release()
	if !answered(r) {
		s.soloConn.lost()
	}
	return r
}

// answered reports whether r came from the server: a reply, or an error
// reply (which includes a nil reply).
func answered(r rueidis.RedisResult) bool {
	err := r.Error()
	if err == nil {
		return true
	}
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

// Bounds of the dial of the lone calls' connection: the PING that proves
// it, and the pause between two tries while the server does not answer.
const (
	soloPing     = time.Second
	soloRetryMin = 100 * time.Millisecond
	soloRetryMax = 5 * time.Second
)

// soloConn keeps the dedicated connection of lone calls ready, dialling it
// in the background: rueidis dials a connection without regard to a call's
// deadline (up to the client's dial timeout, on a server that accepts
// connections but answers nothing), so no call ever waits for one. A call
// on it that gets no answer closes it (rueidis does, for want of the
// reply); lone calls then take the pipeline, whose connection stays up and
// honours their deadline, until a new one answers a PING.
type soloConn struct {
	ready   atomic.Bool // a lone call may take the connection
	client  rueidis.Client
	log     *slog.Logger
	ctx     context.Context // ended by stop
	cancel  context.CancelFunc
	mu      sync.Mutex // guards dialing and wg's Add against stop's Wait
	dialing bool
	wg      sync.WaitGroup
}

// start dials the connection of client's lone calls in the background.
func (c *soloConn) start(client rueidis.Client, log *slog.Logger) {
	c.client, c.log = client, log
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.dial()
}

// lost takes the connection out of use after a call on it got no answer,
// and dials a new one.
func (c *soloConn) lost() {
	c.ready.Store(false)
	c.dial()
}

// dial starts the dialling goroutine unless it runs or the store closed.
func (c *soloConn) dial() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dialing || c.ctx.Err() != nil {
		return
	}
	c.dialing = true
	c.wg.Go(c.redial)
}

// redial proves a dedicated connection with a PING, pausing longer after
// each failure, until one answers (the connection then waits in the
// client's pool for the next lone call) or the store closes.
func (c *soloConn) redial() {
	defer func() {
		c.mu.Lock()
		c.dialing = false
		c.mu.Unlock()
	}()
	for pause := soloRetryMin; ; pause = min(2*pause, soloRetryMax) {
		dc, release := c.client.Dedicate()
		ctx, cancel := context.WithTimeout(c.ctx, soloPing)
		err := dc.Do(ctx, dc.B().Ping().Build()).Error()
		cancel()
		release()
		switch {
		case err == nil:
			c.mu.Lock()
			c.ready.Store(c.ctx.Err() == nil)
			c.mu.Unlock()
			return
		case c.ctx.Err() != nil, errors.Is(err, rueidis.ErrClosing):
			return
		}
		c.log.Debug("redisstore: the connection of lone calls does not answer; they take the pipeline", "err", err)
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(pause):
		}
	}
}

// stop ends the dialling and waits for it; lone calls take the pipeline
// from then on.
func (c *soloConn) stop() {
	if c.cancel == nil {
		return // a Cluster store: never started
	}
	c.mu.Lock()
	c.cancel()
	c.ready.Store(false)
	c.mu.Unlock()
	c.wg.Wait()
}
