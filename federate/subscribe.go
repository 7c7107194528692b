package federate

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// subscriptions holds which client sessions subscribed to each URI of each
// upstream. The upstream holds one subscription of the URI, on its shared
// session, while any client session does; the SDK server tells each
// subscribed client of an update. A client session that ends leaves all
// its subscriptions; a new shared session subscribes again.
type subscriptions struct {
	sync.Mutex
	by      map[subKey]*subState
	watched map[*mcp.ServerSession]bool
	held    map[*mcp.ServerSession]subsHeld // what each session's subscriptions hold
}

// subsHeld is what one session's subscriptions hold: how many, and their
// URIs' bytes (see maxSubscriptions, maxSubscribeBytes).
type subsHeld struct{ n, bytes int }

// subState is one URI of one upstream: its subscribed client sessions,
// and whether the upstream holds the subscription. Its upstream requests
// are sent one at a time, by settle, each once the one before ended: a
// subscription sent while the unsubscription of the last client to leave
// is in flight could land first and be undone by it; and the sessions
// joining a subscription in flight must learn its result, not be told
// "subscribed" before the upstream said so.
type subState struct {
	sessions map[*mcp.ServerSession]bool
	// waiting are the sessions not answered yet (a subscribe of theirs
	// waits): each gets the result of the next upstream subscription.
	waiting  map[*mcp.ServerSession]chan error
	active   bool // the upstream holds the subscription
	settling bool // settle is sending its requests
}

// Bounds of one client session's subscriptions: each is held here, in the
// SDK and upstream for as long as the session lives, and a session kept in
// use never ends. The gateway caps a tenant's sessions
// (sessions.max_per_tenant, 100 by default), not what each holds: these
// bounds keep what a tenant can pin this way small. Its 100 sessions hold
// at most 12,800 subscriptions and 6.25 MiB of URIs, about 25 MiB of heap
// in all with the SDK's copy and the tables' entries (measured: 250 KiB a
// session at the worst), where 1,024 subscriptions of 8 KiB URIs a session
// let one tenant pin about 1 GiB.
const (
	maxSubscriptions = 128
	maxSubscribeURI  = 2 << 10
	// maxSubscribeBytes bounds the URIs of a session's subscriptions
	// together: 128 URIs of 512 bytes on average, or 32 of the longest.
	maxSubscribeBytes = 64 << 10
)

type subKey struct {
	up  *upstream
	uri string
}

// subTimeout bounds one upstream subscription or unsubscription: they
// are made outside the client's request (it serves every subscriber), so
// that a client giving up on its request cancels none.
const subTimeout = 10 * time.Second

func (f *Federator) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	if len(req.Params.URI) > maxSubscribeURI {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("resource URI of %d bytes: at most %d can be subscribed to", len(req.Params.URI), maxSubscribeURI)}
	}
	up := f.resourceOwner(req.Params.URI)
	if up == nil {
		return mcp.ResourceNotFoundError(req.Params.URI)
	}
	k, ss := subKey{up, req.Params.URI}, req.Session
	f.subs.Lock()
	st := f.subs.by[k]
	if st != nil && st.sessions[ss] {
		f.subs.Unlock()
		return nil // already subscribed (or its first subscribe still waits)
	}
	held := f.subs.held[ss]
	if held.n >= maxSubscriptions {
		f.subs.Unlock()
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("this session holds %d subscriptions, the most it may: unsubscribe first", maxSubscriptions)}
	}
	if held.bytes+len(k.uri) > maxSubscribeBytes {
		f.subs.Unlock()
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("this session's subscriptions hold %d bytes of URIs: %d more would pass the most it may, %d: unsubscribe first", held.bytes, len(k.uri), maxSubscribeBytes)}
	}
	if st == nil {
		st = &subState{sessions: map[*mcp.ServerSession]bool{}, waiting: map[*mcp.ServerSession]chan error{}}
		f.subs.by[k] = st
	}
	st.sessions[ss] = true
	f.subs.held[ss] = subsHeld{n: held.n + 1, bytes: held.bytes + len(k.uri)}
	if !f.subs.watched[ss] {
		f.subs.watched[ss] = true
		f.spawn(func() {
			_ = ss.Wait()
			f.leaveAll(ss)
		})
	}
	if st.active && !st.settling {
		f.subs.Unlock()
		return nil
	}
	done := make(chan error, 1)
	st.waiting[ss] = done
	f.subs.Unlock()
	f.settle(k, st)
	return <-done
}

// unsubscribe leaves every subscription the session holds of the URI,
// whichever upstream it was made on: the URI's upstream may have changed
// since (another lists it first, or none does).
func (f *Federator) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	for _, up := range f.ups {
		f.leave(subKey{up, req.Params.URI}, req.Session)
	}
	return nil
}

// subscribed reports whether up holds, or is making, a subscription of
// uri on its shared session: a client session subscribed to it there.
func (f *Federator) subscribed(up *upstream, uri string) bool {
	f.subs.Lock()
	defer f.subs.Unlock()
	st := f.subs.by[subKey{up, uri}]
	return st != nil && (st.active || st.settling)
}

// leave removes ss from k's subscribers and settles k (a session that
// did not subscribe to it changes nothing).
func (f *Federator) leave(k subKey, ss *mcp.ServerSession) {
	f.subs.Lock()
	st := f.subs.by[k]
	if st == nil || !st.sessions[ss] {
		f.subs.Unlock()
		return
	}
	f.removeLocked(k, st, ss, nil)
	f.subs.Unlock()
	f.settle(k, st)
}

// removeLocked removes ss from st's (k's) subscribers, answering err to
// its subscribe if it still waits. f.subs is held.
func (f *Federator) removeLocked(k subKey, st *subState, ss *mcp.ServerSession, err error) {
	delete(st.sessions, ss)
	if done, ok := st.waiting[ss]; ok {
		done <- err
		delete(st.waiting, ss)
	}
	if held := f.subs.held[ss]; held.n <= 1 {
		delete(f.subs.held, ss)
	} else {
		f.subs.held[ss] = subsHeld{n: held.n - 1, bytes: held.bytes - len(k.uri)}
	}
}

// settle sends the upstream requests that make the upstream hold k's
// subscription exactly while a client session does, one at a time, until
// the two agree; it returns at once when another call settles k. A
// subscription that fails is answered to every session waiting for it, and
// all of k's sessions leave: none was told it is subscribed.
func (f *Federator) settle(k subKey, st *subState) {
	f.subs.Lock()
	defer f.subs.Unlock()
	if st.settling {
		return // its loop sees what changed once its request ends
	}
	st.settling = true
	for {
		want := len(st.sessions) > 0
		if want == st.active {
			break
		}
		f.subs.Unlock()
		ctx, cancel := context.WithTimeout(f.ctx, subTimeout)
		err := f.forward(ctx, k.up, nil, true, func(ctx context.Context, cs *mcp.ClientSession) error {
			if want {
				return cs.Subscribe(ctx, &mcp.SubscribeParams{URI: k.uri})
			}
			return cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: k.uri})
		})
		cancel()
		f.subs.Lock()
		switch {
		case want && err == nil:
			st.active = true
			for ss, done := range st.waiting {
				done <- nil
				delete(st.waiting, ss)
			}
		case want:
			for ss := range st.sessions {
				f.removeLocked(k, st, ss, err)
			}
		default:
			// Failed or not, the next subscriber subscribes again.
			st.active = false
			if err != nil && f.ctx.Err() == nil {
				f.log.Warn("federate: cannot unsubscribe upstream", "upstream", k.up.cfg.Name, "uri", k.uri, "err", err)
			}
		}
	}
	st.settling = false
	if !st.active && f.subs.by[k] == st {
		delete(f.subs.by, k)
	}
}

// leaveAll ends the subscriptions of a client session that ended.
func (f *Federator) leaveAll(ss *mcp.ServerSession) {
	f.subs.Lock()
	delete(f.subs.watched, ss)
	var keys []subKey
	for k, st := range f.subs.by {
		if st.sessions[ss] {
			keys = append(keys, k)
		}
	}
	f.subs.Unlock()
	for _, k := range keys {
		f.leave(k, ss)
	}
}

// resubscribe makes up's subscriptions again on its new shared session cs
// (a reconnection, a restarted process), in the background.
func (f *Federator) resubscribe(up *upstream, cs *mcp.ClientSession) {
	f.subs.Lock()
	var uris []string
	for k, st := range f.subs.by {
		if k.up == up && len(st.sessions) > 0 {
			uris = append(uris, k.uri)
		}
	}
	f.subs.Unlock()
	if len(uris) == 0 {
		return
	}
	f.spawn(func() {
		for _, uri := range uris {
			ctx, cancel := context.WithTimeout(f.ctx, subTimeout)
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
				f.log.Warn("federate: cannot subscribe again", "upstream", up.cfg.Name, "uri", uri, "err", err)
			}
			cancel()
		}
	})
}
