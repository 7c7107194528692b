package redisstore

import (
	"context"
	"errors"
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
// latency (docs/benchmarks.md, F.3). On a dedicated connection rueidis
// writes and reads on the caller's goroutine, as go-redis does. Only a
// call that finds no other under way takes it, so no two calls ever share
// it, and calls under load keep the pipeline. On it a call ends at its
// deadline, as on the pipeline, but a cancelled caller waits for the
// deadline too (the store's timeout at most).
func (s *Store) solo(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	defer s.inflight.Add(-1)
	if s.inflight.Add(1) != 1 {
		return s.client.Do(ctx, cmd)
	}
	if !s.soloConn.ready.Load() {
		// Lone, without its connection (not dialled yet, or lost): the
		// pipeline's connection, used by one call at a time, is in
		// rueidis's synchronous mode too, which closes it when a call gets
		// no answer, and the next call would wait for its dial, whatever
		// its deadline. So the call returns by its deadline whatever
		// rueidis does (see bounded).
		return bounded(ctx, func() rueidis.RedisResult { return s.client.Do(ctx, cmd) }, rueidis.NewErrorResult)
	}
	dc, release := s.client.Dedicate()
	r := dc.Do(ctx, cmd)
	release()
	if r.NonRedisError() != nil { // no answer: the keeper dials a new one
		s.soloConn.ready.Store(false)
	}
	return r
}

// Timing of the lone calls' connection: the PING that proves it, the
// pause between two tries while the server does not answer, and the PING
// that keeps it while idle.
const (
	soloPing     = time.Second
	soloRetryMin = 100 * time.Millisecond
	soloRetryMax = 5 * time.Second
)

// defaultSoloKeep is the keeper's PING interval on an idle connection:
// under rueidis's keep-alive interval (the dialer's KeepAlive, 1 s by
// default).
const defaultSoloKeep = 250 * time.Millisecond

// soloConn keeps the dedicated connection of lone calls ready, from one
// goroutine per store:
//
//   - it dials the connection and proves it with a PING before any call
//     may take it: rueidis dials without regard to a call's deadline (up to
//     the client's dial timeout, on a server that accepts connections but
//     answers nothing), so no call ever waits for a dial. A call on it that
//     gets no answer closes it (rueidis does, for want of the reply) and
//     clears ready; lone calls then take the pipeline with a hard deadline
//     (see solo) until the keeper, at its next turn, has a new one answer;
//   - while it is idle, it PINGs it every keepEvery, counted as a call of
//     the store (so never at the same time as one). rueidis's own
//     keep-alive PINGs a connection that received nothing for a while; one
//     that met a call would leave the connection queueing every later call
//     to background goroutines, and every release sending UNSUBSCRIBEs:
//     the keeper's answers are what keeps rueidis's from being sent.
type soloConn struct {
	ready     atomic.Bool // a lone call may take the connection
	store     *Store
	keepEvery time.Duration
	ctx       context.Context // ended by stop
	cancel    context.CancelFunc
	done      chan struct{} // closed when the goroutine returned
}

// start runs s's keeper of the lone calls' connection.
func (c *soloConn) start(s *Store, keepEvery time.Duration) {
	c.store, c.keepEvery = s, keepEvery
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.done = make(chan struct{})
	go c.run()
}

func (c *soloConn) run() {
	defer close(c.done)
	for c.dial() && c.keep() {
	}
}

// dial proves a dedicated connection with a PING, pausing longer after
// each failure, until one answers (it then waits in the client's pool for
// the next lone call, and ready is set) or the store closes (false).
func (c *soloConn) dial() bool {
	for pause := soloRetryMin; ; pause = min(2*pause, soloRetryMax) {
		err := c.ping()
		switch {
		case err == nil:
			c.ready.Store(true)
			return true
		case errors.Is(err, rueidis.ErrClosing):
			return false
		}
		c.store.log.Debug("redisstore: the connection of lone calls does not answer; they take the pipeline", "err", err)
		select {
		case <-c.ctx.Done():
			return false
		case <-time.After(pause):
		}
	}
}

// keep PINGs the idle connection every keepEvery, skipping a turn when a
// call is under way, until a call or the PING found it dead (true: dial
// again) or the store closes (false).
func (c *soloConn) keep() bool {
	tick := time.NewTicker(c.keepEvery)
	defer tick.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return false
		case <-tick.C:
		}
		if c.store.inflight.Add(1) == 1 && c.ready.Load() && c.ping() != nil {
			c.ready.Store(false)
		}
		c.store.inflight.Add(-1)
		if !c.ready.Load() {
			return c.ctx.Err() == nil
		}
	}
}

// ping sends a PING on a dedicated connection of the client's pool.
func (c *soloConn) ping() error {
	dc, release := c.store.client.Dedicate()
	defer release()
	ctx, cancel := context.WithTimeout(c.ctx, soloPing)
	defer cancel()
	return dc.Do(ctx, dc.B().Ping().Build()).Error()
}

// stop ends the keeper and waits for it; lone calls take the pipeline from
// then on (ready is cleared once the keeper cannot set it again).
func (c *soloConn) stop() {
	if c.cancel == nil {
		return // a Cluster store: never started
	}
	c.cancel()
	<-c.done
	c.ready.Store(false)
}
