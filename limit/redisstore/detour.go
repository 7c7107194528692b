package redisstore

import (
	"context"
	"errors"
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
// So when a call to a slot fails for want of an answer (a connection error,
// a timeout, CLUSTERDOWN), the store watches the slot (follow): every
// watchPause it asks, at once, (1) the client, whether a read of a key in
// the slot gets an answer (the client's own routing works: the watch ends),
// and (2) every node the client knows, who owns the slot (CLUSTER MYID and
// CLUSTER SLOTS). Once a node that answers claims the slot and a majority
// of the nodes name it (a promoted replica says so as soon as it takes
// over, the others as soon as gossip tells them; the dead master answers
// nothing), the slot's calls
// go to that node directly, through the client's own connection to it,
// until the client's routing works again. A node that answers a detoured
// call with MOVED or ASK did not run it: the detour is dropped and the call
// goes through the client, which follows the redirection.
//
// Nothing is sent twice that may have run: the watch only reads, and a call
// that failed stays failed. The hot path pays one atomic load when no slot
// is watched.
const (
	// watchPause is the pause between two looks at a watched slot.
	watchPause = 50 * time.Millisecond
	// lookTimeout bounds one look (a frozen node answers nothing).
	lookTimeout = 200 * time.Millisecond
	// watchLimit ends a watch that never saw the slot served again (a
	// cluster down for longer); the next failed call starts another.
	watchLimit = time.Minute
	// maxWatched bounds the slots watched at once: a Redis that stopped
	// answering altogether fails every slot's calls.
	maxWatched = 64
)

// detours are the slots of a Cluster under watch. The zero value is ready;
// stop ends every watch.
type detours struct {
	n       atomic.Int32 // len(slots): all the hot path reads
	mu      sync.Mutex
	slots   map[uint16]*detour
	stopped bool
	done    chan struct{} // closed by stop
	wg      sync.WaitGroup
}

// detour is one watched slot: to is the node its calls go to, nil while
// the new owner is not known (calls go through the client).
type detour struct {
	to atomic.Pointer[node]
}

// node is a Cluster node's client, on the cluster client's connection.
type node struct {
	id     string
	client rueidis.Client
}

// route returns the client b's call goes through: the node its slot is
// detoured to, else the store's client.
func (s *Store) route(b *batch) rueidis.Client {
	if s.detours.n.Load() == 0 || len(b.keys) == 0 {
		return s.client
	}
	slot := keyspace.Slot(b.keys[0])
	s.detours.mu.Lock()
	d := s.detours.slots[slot]
	s.detours.mu.Unlock()
	if d != nil {
		if to := d.to.Load(); to != nil {
			return to.client
		}
	}
	return s.client
}

// send sends b once through c (see route). When c is a detour and the node
// answers MOVED or ASK (it did not run the call: the slot moved on), the
// detour is dropped and b goes through the store's client.
func (s *Store) send(ctx context.Context, c rueidis.Client, b *batch, fn, eval bool) rueidis.RedisResult {
	r := s.do(ctx, c, s.command(b, fn, eval))
	if c == s.client {
		return r
	}
	if rerr, ok := rueidis.IsRedisErr(r.Error()); ok {
		_, moved := rerr.IsMoved()
		_, ask := rerr.IsAsk()
		if moved || ask {
			s.detours.drop(keyspace.Slot(b.keys[0]))
			return s.do(ctx, s.client, s.command(b, fn, eval))
		}
	}
	return r
}

// do sends cmd through c. While a slot is watched it returns by the end of
// ctx whatever c does: a call that meets a connection being dialled to a
// hung node waits for the dial (up to the dial timeout), ctx or not, and a
// failover is when that happens. The call left behind ends on its own; its
// caller sees a timeout, which says the call may have run, as any timeout.
func (s *Store) do(ctx context.Context, c rueidis.Client, cmd rueidis.Completed) rueidis.RedisResult {
	if s.detours.n.Load() == 0 {
		return c.Do(ctx, cmd)
	}
	done := make(chan rueidis.RedisResult, 1)
	go func() { done <- c.Do(ctx, cmd) }()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		return rueidis.NewErrorResult(ctx.Err())
	}
}

// observe starts a watch of b's slot when err says its call got no answer
// from the slot's owner: a connection error, a timeout, or CLUSTERDOWN. A
// call the caller cancelled, or one a server refused, says nothing about
// the slot.
func (s *Store) observe(b *batch, err error) {
	if !s.cluster || err == nil || len(b.keys) == 0 || errors.Is(err, context.Canceled) {
		return
	}
	if rerr, ok := rueidis.IsRedisErr(err); ok && !rerr.IsClusterDown() {
		return
	}
	slot, key := keyspace.Slot(b.keys[0]), b.keys[0]
	d := s.detours.add(slot)
	if d == nil {
		return
	}
	s.log.Debug("redisstore: a call to a Cluster slot got no answer; watching the slot", "slot", slot, "err", err)
	go func() {
		defer s.detours.wg.Done()
		s.follow(slot, key, d)
	}()
}

// add registers a watch of slot and returns it, or nil when slot is
// watched already, too many slots are, or the store is closed. The caller
// runs the watch and calls wg.Done when it ends.
func (ds *detours) add(slot uint16) *detour {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.stopped || ds.slots[slot] != nil || len(ds.slots) >= maxWatched {
		return nil
	}
	if ds.slots == nil {
		ds.slots = make(map[uint16]*detour)
		ds.done = make(chan struct{})
	}
	d := new(detour)
	ds.slots[slot] = d
	ds.n.Store(int32(len(ds.slots)))
	ds.wg.Add(1) // under mu: stop's Wait cannot have begun
	return d
}

// drop sends slot's calls through the client again; its watch goes on.
func (ds *detours) drop(slot uint16) {
	ds.mu.Lock()
	if d := ds.slots[slot]; d != nil {
		d.to.Store(nil)
	}
	ds.mu.Unlock()
}

// remove ends the watch d of slot.
func (ds *detours) remove(slot uint16, d *detour) {
	ds.mu.Lock()
	if ds.slots[slot] == d {
		delete(ds.slots, slot)
		ds.n.Store(int32(len(ds.slots)))
	}
	ds.mu.Unlock()
}

// stop ends every watch and waits for them; no watch starts after it.
func (ds *detours) stop() {
	ds.mu.Lock()
	if !ds.stopped {
		ds.stopped = true
		if ds.done != nil {
			close(ds.done)
		}
	}
	ds.mu.Unlock()
	ds.wg.Wait()
}

// follow watches slot (key is one of its keys) until the client serves it
// again, detouring its calls meanwhile to the node that took it over.
func (s *Store) follow(slot uint16, key string, d *detour) {
	defer s.detours.remove(slot, d)
	end := time.Now().Add(watchLimit)
	for {
		if s.look(slot, key, d) {
			if d.to.Load() != nil {
				s.log.Info("redisstore: the client routes a failed-over slot again; detour ended", "slot", slot)
			} else {
				s.log.Debug("redisstore: the client routes the slot again", "slot", slot)
			}
			return
		}
		t := time.NewTimer(watchPause)
		select {
		case <-s.detours.done:
			t.Stop()
			return
		case <-t.C:
		}
		if time.Now().After(end) {
			return
		}
	}
}

// look asks, at once, whether the client gets an answer for key (its
// routing of slot works: look reports true) and which node owns slot (see
// owner), detouring d to it as soon as it is known. It returns when either
// question is settled, within lookTimeout: a call stuck on a hung node
// (rueidis waits for a connection being dialled whatever the context says)
// is left to end on its own.
func (s *Store) look(slot uint16, key string, d *detour) (served bool) {
	ctx, cancel := context.WithTimeout(context.Background(), lookTimeout)
	defer cancel()
	settled := make(chan struct{})
	s.detours.wg.Go(func() {
		defer close(settled)
		owner := s.owner(ctx, slot)
		if owner == nil {
			return
		}
		if prev := d.to.Swap(owner); prev == nil || prev.id != owner.id {
			s.log.Warn("redisstore: a slot's master stopped answering; its calls go to the node that took it over until the client refreshes its slot map", "slot", slot, "node", owner.id)
		}
	})
	answered := make(chan bool, 1)
	s.detours.wg.Go(func() {
		answered <- s.client.Do(ctx, s.client.B().Pttl().Key(key).Build()).Error() == nil
	})
	select {
	case served = <-answered:
	case <-settled:
		// The client's answer, when it comes at once, still counts.
		select {
		case served = <-answered:
		default:
		}
	case <-ctx.Done():
	case <-s.detours.done:
	}
	return served
}

// owner asks every node the client knows for its id and its view of the
// slot map, and returns the node that owns slot: one that answers and
// claims slot itself, named as its owner by a majority of the nodes asked.
// It returns as soon as one has that majority (a dead node's answer is not
// waited for), nil when none has it by the end of ctx (the failover is not
// done, the answers disagree).
func (s *Store) owner(ctx context.Context, slot uint16) *node {
	nodes := s.client.Nodes()
	type view struct {
		self, owner string
		client      rueidis.Client
	}
	views := make(chan view, len(nodes)) // never blocks a sender
	for _, c := range nodes {
		s.detours.wg.Go(func() {
			rs := c.DoMulti(ctx, c.B().ClusterMyid().Build(), c.B().ClusterSlots().Build())
			self, err := rs[0].ToString()
			owner, ok := slotMaster(rs[1], slot)
			if err != nil || !ok {
				self, owner = "", ""
			}
			views <- view{self, owner, c}
		})
	}
	votes := map[string]int{}
	claims := map[string]rueidis.Client{}
	for range nodes {
		var v view
		select {
		case v = <-views:
		case <-ctx.Done():
			return nil
		}
		if v.owner == "" {
			continue
		}
		votes[v.owner]++
		if v.self == v.owner {
			claims[v.self] = v.client
		}
		if c := claims[v.owner]; c != nil && votes[v.owner] > len(nodes)/2 {
			return &node{id: v.owner, client: c}
		}
	}
	return nil
}

// slotMaster returns the id of slot's master in a CLUSTER SLOTS reply:
// entries [start, end, [host, port, id, ...], replicas...].
func slotMaster(r rueidis.RedisResult, slot uint16) (string, bool) {
	ranges, err := r.ToArray()
	if err != nil {
		return "", false
	}
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
			return "", false
		}
		id, err := master[2].ToString()
		return id, err == nil && id != ""
	}
	return "", false
}
