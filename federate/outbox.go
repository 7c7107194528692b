package federate

import (
	"context"
	"sync"
	"time"
)

// MaxPending is how many notifications may wait for one client session
// (and for one upstream's resource updates); the next ones are dropped
// and told to Options.OnDropped until the client takes some.
const MaxPending = 256

// outboxes relay notifications off the goroutine that received them. The
// SDK client hands an upstream session's notifications to one goroutine,
// in order, and a write to a client that stops reading blocks until the
// server's write timeout: on a shared session (a stdio upstream, stateless
// clients) that goroutine would hold every other client's progress and log
// messages behind the stalled one, and their answers, which wait for the
// notifications sent before them (wireCount), with them. So each
// destination has a queue of its own, sent in order by a goroutine that
// lives while the queue is not empty; the upstream's goroutine only
// queues.
type outboxes struct {
	mu sync.Mutex
	m  map[any]*outbox // by destination: a *mcp.ServerSession, or an *upstream (its resource updates)
}

// outbox is one destination's queue. It is in outboxes.m exactly while
// its goroutine runs.
type outbox struct {
	q     []pending
	notes int // entries of q that are notifications
}

// pending is a queued send: a notification, or a flush mark (note false)
// that is not counted against MaxPending.
type pending struct {
	send func()
	note bool
}

// post queues send, a notification of method for destination to, and
// reports whether it was queued: not when to has MaxPending waiting (then
// Options.OnDropped is told) or the Federator is closing.
func (f *Federator) post(to any, method string, send func()) bool {
	t := &f.outboxes
	t.mu.Lock()
	ob := t.m[to]
	switch {
	case ob == nil:
		ob = &outbox{}
		if !f.spawn(func() { f.deliver(to, ob) }) {
			t.mu.Unlock()
			return false
		}
		if t.m == nil {
			t.m = map[any]*outbox{}
		}
		t.m[to] = ob
	case ob.notes >= MaxPending:
		t.mu.Unlock()
		if f.opts.OnDropped != nil {
			f.opts.OnDropped(method)
		}
		return false
	}
	ob.q = append(ob.q, pending{send, true})
	ob.notes++
	t.mu.Unlock()
	return true
}

// deliver sends ob's queue in order until it is empty, then retires ob.
func (f *Federator) deliver(to any, ob *outbox) {
	t := &f.outboxes
	for {
		t.mu.Lock()
		if len(ob.q) == 0 {
			delete(t.m, to)
			t.mu.Unlock()
			return
		}
		p := ob.q[0]
		ob.q[0] = pending{}
		ob.q = ob.q[1:]
		if p.note {
			ob.notes--
		}
		t.mu.Unlock()
		p.send()
	}
}

// flush waits until what was queued for to so far has been sent, for at
// most drainWait or until ctx ends: a call's answer waits for the
// notifications relayed before it, but not without bound for a client
// that stopped reading.
func (f *Federator) flush(ctx context.Context, to any) {
	done := make(chan struct{})
	t := &f.outboxes
	t.mu.Lock()
	ob := t.m[to]
	if ob == nil {
		t.mu.Unlock()
		return
	}
	ob.q = append(ob.q, pending{send: func() { close(done) }})
	t.mu.Unlock()
	timer := time.NewTimer(drainWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
	}
}
