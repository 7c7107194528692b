package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/keyspace"
)

// Detours: how a Store on a Redis Cluster gets its calls to a slot's new
// master as soon as the failover is done, instead of when the client
// notices.
//
// rueidis refreshes its slot map after a connection error, but only after a
// random delay of up to a second (to spread the refreshes of many clients),
// and not at all after a call that timed out; a refresh made before the
// replica was promoted finds the dead master again. Until its next refresh
// the client sends the slot's calls to the dead master, so decisions came
// back anywhere from a few milliseconds to well over a second after the
// cluster reported cluster_state:ok.
//
// So when a call to a slot gets no answer (a connection error, the store's
// own deadline, CLUSTERDOWN), the store watches the slot. One watcher per
// store looks at every watched slot, a look every watchPause plus the
// look's own time (a look waits lookTimeout at most, for a hung node),
// asking at once (1) the client, whether a read of a key in each slot gets
// an answer (its routing of the slot works: the slot's watch ends), and (2)
// from a slot's second look on, every node the client knows, who owns the
// watched slots (CLUSTER MYID and CLUSTER SLOTS, one question per node for
// all slots). Every question is sent once (rueidis would retry a read
// after a connection error until the look's deadline). Once a node that
// answers claims a slot, and a majority of the nodes the client knows
// (the dead master counted) name it, the slot's calls, and those of the
// range of slots the node claims around it (a failed master's slots move
// together, and every tenant has a slot of its own), go to that node
// directly, through the client's own connection to it, until the client's
// routing of the watched slot works again (a refresh reads the whole map).
// A promoted replica claims the slot as soon as it takes over, the others
// name it as soon as gossip tells them; a dead or hung master answers
// nothing. A node that answers a detoured call with MOVED or ASK did not
// run it: the detour is dropped and the call goes through the client,
// which follows the redirection.
//
// Nothing is sent twice that may have run: the watcher only reads, and a
// call that failed stays failed. While a slot is watched, its calls return
// by their deadline whatever the client does (see bounded). When no slot is
// watched, the hot path pays one atomic load.
const (
	// watchPause is the pause between two looks.
	watchPause = 50 * time.Millisecond
	// lookTimeout bounds one look (a hung node answers nothing).
	lookTimeout = 200 * time.Millisecond
	// watchLimit ends the watch of a slot never seen served again (a
	// cluster down for longer); the next call that fails starts another.
	watchLimit = time.Minute
	// maxWatched bounds the slots watched at once: a Redis that stopped
	// answering altogether fails every slot's calls, and every tenant has
	// a slot of its own (its hash tag). A slot beyond it is detoured all
	// the same when it lies in a detoured slot's range.
	maxWatched = 256
)

// detours are the watched slots of a Cluster store. The zero value is
// ready; stop ends the watcher.
type detours struct {
	// view is where calls go while some slot is watched; nil when none is.
	// Replaced, never changed: the hot path reads it without a lock.
	view atomic.Pointer[routes]

	mu      sync.Mutex
	slots   map[uint16]*watch
	begun   int  // watches begun, ended or not (for tests: a watch may end at once)
	running bool // the watcher goroutine is running
	stopped bool
	done    chan struct{} // closed by stop
	wg      sync.WaitGroup
}

// watch is one watched slot.
type watch struct {
	key   string    // a key in the slot, for the client's read
	since time.Time // when the watch began
	looks int       // looks done
	to    *node     // the node its calls go to, nil: the client
	// lo and hi are the range of slots around it that to claims: their
	// calls go to to as well, watched or not (a failed master's slots all
	// moved together).
	lo, hi uint16
}

// routes are the calls' detours: each watched slot's node (nil: through
// the client) and the ranges the detoured slots' nodes claim.
type routes struct {
	slots  map[uint16]*node
	ranges []span
}

// span is a range of slots whose calls go to a node.
type span struct {
	lo, hi uint16
	to     *node
}

// of returns the node slot's calls go to (nil: the client) and whether
// slot is watched. A watched slot's own detour comes first, then the
// ranges (a handful: one per failed master's range that held a watched
// slot).
func (r *routes) of(slot uint16) (*node, bool) {
	to, watched := r.slots[slot]
	if to != nil {
		return to, true
	}
	for _, sp := range r.ranges {
		if sp.lo <= slot && slot <= sp.hi {
			return sp.to, watched
		}
	}
	return nil, watched
}

// node is a Cluster node's client, on the cluster client's connection.
type node struct {
	id     string
	client rueidis.Client
}

// route returns the client b's call goes through (the node its slot is
// detoured to, else the store's client) and whether its slot is watched.
func (s *Store) route(b *batch) (rueidis.Client, bool) {
	v := s.detours.view.Load()
	if v == nil || len(b.keys) == 0 {
		return s.client, false
	}
	to, watched := v.of(keyspace.Slot(b.keys[0]))
	if to != nil {
		return to.client, watched
	}
	return s.client, watched
}

// send sends b once, by the route its slot has now (see route: a detour
// may have been set or dropped since b's last try). When it went to a
// detour and the node answers MOVED or ASK (it did not run the call: the
// slot moved on), that detour is dropped and b goes through the store's
// client.
func (s *Store) send(ctx context.Context, b *batch, fn, eval bool) rueidis.RedisResult {
	c, watched := s.route(b)
	r := s.do(ctx, c, watched, s.command(b, fn, eval))
	if c == s.client {
		return r
	}
	if rerr, ok := rueidis.IsRedisErr(r.Error()); ok {
		_, moved := rerr.IsMoved()
		_, ask := rerr.IsAsk()
		if moved || ask {
			s.detours.undetour(keyspace.Slot(b.keys[0]), c)
			return s.do(ctx, s.client, watched, s.command(b, fn, eval))
		}
	}
	return r
}

// do sends cmd through c. For a watched slot it returns by the end of ctx
// whatever c does (see bounded); on a standalone or Sentinel client, see
// solo.
func (s *Store) do(ctx context.Context, c rueidis.Client, watched bool, cmd rueidis.Completed) rueidis.RedisResult {
	switch {
	case watched:
		return bounded(ctx, func() rueidis.RedisResult { return c.Do(ctx, cmd) }, rueidis.NewErrorResult)
	case !s.cluster:
		return s.solo(ctx, cmd)
	}
	return c.Do(ctx, cmd)
}

// doMulti is do for a pipeline of commands through the store's client.
func (s *Store) doMulti(ctx context.Context, watched bool, cmds rueidis.Commands) []rueidis.RedisResult {
	if !watched {
		return s.client.DoMulti(ctx, cmds...)
	}
	return bounded(ctx, func() []rueidis.RedisResult { return s.client.DoMulti(ctx, cmds...) },
		func(err error) []rueidis.RedisResult {
			rs := make([]rueidis.RedisResult, len(cmds))
			for i := range rs {
				rs[i] = rueidis.NewErrorResult(err)
			}
			return rs
		})
}

// bounded returns what call returns, or by the end of ctx what late makes
// of ctx's error: a call that meets a connection being dialled to a hung
// node waits for the dial (up to the dial timeout), ctx or not, and a
// watched slot is where that happens. The call left behind ends on its
// own; its caller sees a timeout, which says the call may have run, as any
// timeout.
func bounded[T any](ctx context.Context, call func() T, late func(error) T) T {
	done := make(chan T, 1)
	go func() { done <- call() }()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		select {
		case r := <-done: // an answer that came with the deadline still counts
			return r
		default:
			return late(ctx.Err())
		}
	}
}

// observe starts the watch of b's slot when err says its call got no
// answer from the slot's owner: a connection error, the store's own
// deadline, or CLUSTERDOWN. A call whose caller's context ended (parent),
// one made on a closed client, or one a server refused, says nothing about
// the slot. So a caller whose own deadline is never later than
// Options.Timeout starts no watch by timing out: it sees its own deadline
// (the gateway's requests carry none).
func (s *Store) observe(parent context.Context, b *batch, err error) {
	if !s.cluster || err == nil || len(b.keys) == 0 || parent.Err() != nil ||
		errors.Is(err, context.Canceled) || errors.Is(err, rueidis.ErrClosing) {
		return
	}
	if rerr, ok := rueidis.IsRedisErr(err); ok && !rerr.IsClusterDown() {
		return
	}
	s.detours.watch(keyspace.Slot(b.keys[0]), b.keys[0], func() { s.watcher() })
}

// watch adds slot (key is one of its keys) to the watched slots, starting
// run as the watcher when none runs. It does nothing when slot is watched
// already, too many slots are, or the store is closed.
func (ds *detours) watch(slot uint16, key string, run func()) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.stopped || ds.slots[slot] != nil || len(ds.slots) >= maxWatched {
		return
	}
	if ds.slots == nil {
		ds.slots = make(map[uint16]*watch)
		ds.done = make(chan struct{})
	}
	ds.slots[slot] = &watch{key: key, since: time.Now()}
	ds.begun++
	ds.publishLocked()
	if !ds.running {
		ds.running = true
		ds.wg.Add(1) // under mu: stop's Wait cannot have begun
		go func() {
			defer ds.wg.Done()
			run()
		}()
	}
}

// detour sends the calls of slot, and of the range lo..hi around it, to
// the node to while slot is watched, and reports whether that changed the
// node they go to (a new client for the same node, rueidis having replaced
// the connection, is taken silently).
func (ds *detours) detour(slot uint16, to *node, lo, hi uint16) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	w := ds.slots[slot]
	if w == nil || w.to != nil && w.to.id == to.id && w.to.client == to.client && w.lo == lo && w.hi == hi {
		return false
	}
	changed := w.to == nil || w.to.id != to.id
	w.to, w.lo, w.hi = to, lo, hi
	ds.publishLocked()
	return changed
}

// undetour sends slot's calls through the client again, unless they no
// longer go to c (a look set a newer detour since the call was routed):
// slot's own detour, and every range holding slot, that go to c.
func (ds *detours) undetour(slot uint16, c rueidis.Client) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	changed := false
	for s, w := range ds.slots {
		if w.to != nil && w.to.client == c && (s == slot || w.lo <= slot && slot <= w.hi) {
			w.to = nil
			changed = true
		}
	}
	if changed {
		ds.publishLocked()
	}
}

// publishLocked replaces the view with the watched slots' routes. Call
// with mu held.
func (ds *detours) publishLocked() {
	if len(ds.slots) == 0 {
		ds.view.Store(nil)
		return
	}
	v := &routes{slots: make(map[uint16]*node, len(ds.slots))}
	for slot, w := range ds.slots {
		v.slots[slot] = w.to
		if w.to != nil && !v.covered(w.lo, w.hi, w.to) {
			v.ranges = append(v.ranges, span{w.lo, w.hi, w.to})
		}
	}
	ds.view.Store(v)
}

// covered reports whether r already sends the range lo..hi to the node to.
func (r *routes) covered(lo, hi uint16, to *node) bool {
	for _, sp := range r.ranges {
		if sp.lo == lo && sp.hi == hi && sp.to.id == to.id {
			return true
		}
	}
	return false
}

// stop ends the watcher and waits for it and for the questions it left
// out (each ends by lookTimeout plus its node's dial timeout at most); no
// watch starts after it.
func (ds *detours) stop() {
	ds.mu.Lock()
	if !ds.stopped {
		ds.stopped = true
		if ds.done != nil {
			close(ds.done)
		}
		clear(ds.slots)
		ds.publishLocked()
	}
	ds.mu.Unlock()
	ds.wg.Wait()
}

// watcher looks at the watched slots every watchPause until none is left
// (or the store is closed).
func (s *Store) watcher() {
	ds := &s.detours
	for {
		ds.mu.Lock()
		now, expired := time.Now(), false
		for slot, w := range ds.slots {
			if now.Sub(w.since) > watchLimit {
				delete(ds.slots, slot)
				expired = true
			}
		}
		if len(ds.slots) == 0 || ds.stopped {
			ds.running = false
			ds.publishLocked()
			ds.mu.Unlock()
			return
		}
		if expired {
			ds.publishLocked()
		}
		look := make(map[uint16]watch, len(ds.slots))
		for slot, w := range ds.slots {
			look[slot] = *w
			w.looks++
		}
		ds.mu.Unlock()

		s.look(look)
		t := time.NewTimer(watchPause)
		select {
		case <-ds.done:
			t.Stop()
		case <-t.C:
		}
	}
}

// look asks, at once, whether the client gets an answer for each slot's key
// (the slots it serves stop being watched) and which node owns each slot
// looked at before (a slot is detoured as soon as its owner is known). It
// returns when every question is settled, or after lookTimeout: a question
// stuck on a hung node (rueidis waits for a connection being dialled
// whatever the context says) is left to end on its own.
func (s *Store) look(slots map[uint16]watch) {
	ds := &s.detours
	ctx, cancel := context.WithTimeout(context.Background(), lookTimeout)
	defer cancel()
	served := make(chan servedSlot, len(slots)) // never blocks a sender
	var again []uint16                          // slots looked at before: ask who owns them
	for slot, w := range slots {
		ds.wg.Go(func() { served <- servedSlot{slot, s.served(ctx, w.key)} })
		if w.looks > 0 {
			again = append(again, slot)
		}
	}
	owners := make(chan map[uint16]owner, 1)
	pending := len(slots)
	if len(again) > 0 {
		pending++
		ds.wg.Go(func() { owners <- s.owners(ctx, again) })
	}
	for ; pending > 0; pending-- {
		select {
		case m := <-owners:
			for slot, o := range m {
				if ds.detour(slot, o.node, o.lo, o.hi) {
					s.log.Warn("redisstore: a Cluster slot's calls get no answer through the client; they go to the node that owns it, with its range, until the client refreshes its slot map", "slot", slot, "range", fmt.Sprintf("%d-%d", o.lo, o.hi), "node", o.id)
				}
			}
		case a := <-served:
			if a.ok {
				ds.end(a.slot, s.log)
			}
		case <-ctx.Done():
			return
		case <-ds.done:
			return
		}
	}
}

// servedSlot is the client's answer for a slot: ok when it got one.
type servedSlot struct {
	slot uint16
	ok   bool
}

// served reads key through the client and reports whether it got an
// answer from the owner of key's slot: a value, or an error reply that
// does not say the cluster cannot serve it (a user not allowed PTTL still
// got an answer). The read is sent once: rueidis would retry a read-only
// command after a connection error until ctx ends, and a look must learn
// that the slot is not served as soon as the client does. A closed client
// serves nothing any more: the watch ends.
func (s *Store) served(ctx context.Context, key string) bool {
	err := s.client.Do(ctx, s.client.B().Arbitrary("PTTL").Keys(key).Build()).Error()
	if err == nil || errors.Is(err, rueidis.ErrClosing) {
		return true
	}
	rerr, isRedis := rueidis.IsRedisErr(err)
	return isRedis && !cannotServe(rerr)
}

// end ends the watch of slot, the client serving it again.
func (ds *detours) end(slot uint16, log *slog.Logger) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	w := ds.slots[slot]
	if w == nil {
		return
	}
	if w.to != nil {
		log.Info("redisstore: the client routes a detoured Cluster slot again; detour ended", "slot", slot)
	}
	delete(ds.slots, slot)
	ds.publishLocked()
}

// owner is the node that owns a slot, and the range of slots around it
// that the node claims.
type owner struct {
	*node
	lo, hi uint16
}

// owners asks every node the client knows for its id and its view of the
// slot map, and returns, for each of slots that has one, the node that owns
// it: one that answers and claims the slot itself, named as its owner by a
// majority of the nodes the client knows (a node that does not answer, the
// dead master, counts against), with the range around the slot that the
// node claims. It returns as soon as every slot has one (a dead node's
// answer is not waited for), or when every node answered or ctx ended.
func (s *Store) owners(ctx context.Context, slots []uint16) map[uint16]owner {
	nodes := s.client.Nodes()
	type view struct {
		self   string
		owners []slotRange // of slots, in order; id "" unknown
		client rueidis.Client
	}
	views := make(chan view, len(nodes)) // never blocks a sender
	for _, c := range nodes {
		s.detours.wg.Go(func() {
			// Sent once (see served): a dead node's answer is an error at once.
			rs := c.DoMulti(ctx, c.B().Arbitrary("CLUSTER", "MYID").Build(), c.B().Arbitrary("CLUSTER", "SLOTS").Build())
			self, err := rs[0].ToString()
			ranges, err2 := rs[1].ToArray()
			if err != nil || err2 != nil {
				views <- view{}
				return
			}
			owners := make([]slotRange, len(slots))
			for i, slot := range slots {
				owners[i] = slotMaster(ranges, slot)
			}
			views <- view{self, owners, c}
		})
	}
	votes := make([]map[string]int, len(slots))
	claims := make([]map[string]owner, len(slots))
	for i := range slots {
		votes[i], claims[i] = map[string]int{}, map[string]owner{}
	}
	found := make(map[uint16]owner, len(slots))
	for range nodes {
		var v view
		select {
		case v = <-views:
		case <-ctx.Done():
			return found
		}
		for i, r := range v.owners {
			if r.id == "" {
				continue
			}
			votes[i][r.id]++
			if r.id == v.self {
				claims[i][r.id] = owner{&node{id: r.id, client: v.client}, r.lo, r.hi}
			}
			if o, ok := claims[i][r.id]; ok && votes[i][r.id] > len(nodes)/2 {
				found[slots[i]] = o
			}
		}
		if len(found) == len(slots) {
			break
		}
	}
	return found
}

// slotRange is a range of slots and the id of its master.
type slotRange struct {
	lo, hi uint16
	id     string
}

// slotMaster returns the range holding slot in a CLUSTER SLOTS reply
// (entries [start, end, [host, port, id, ...], replicas...]) and its
// master's id; the id is "" when the reply names none.
func slotMaster(ranges []rueidis.RedisMessage, slot uint16) slotRange {
	for _, rg := range ranges {
		e, err := rg.ToArray()
		if err != nil || len(e) < 3 {
			continue
		}
		lo, err1 := e[0].AsInt64()
		hi, err2 := e[1].AsInt64()
		if err1 != nil || err2 != nil || int64(slot) < lo || int64(slot) > hi {
			continue
		}
		master, err := e[2].ToArray()
		if err != nil || len(master) < 3 {
			return slotRange{}
		}
		id, _ := master[2].ToString()
		return slotRange{uint16(lo), uint16(hi), id}
	}
	return slotRange{}
}

// watchedSlots is the watched slots (for tests).
func (ds *detours) watchedSlots() map[uint16]*node {
	if v := ds.view.Load(); v != nil {
		return maps.Clone(v.slots)
	}
	return nil
}
