//lint:file-ignore SA1019 sampling, elicitation, roots and logging are deprecated in MCP 2026-07-28 but still served; the federation relays them.
package federate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// errSessionEnded means the client session (or the Federator) ended
// before the call could be sent: nothing to tell the breaker.
var errSessionEnded = errors.New("federate: client session ended")

// errNoClient is the answer to a server-to-client request of a shared
// session: no client can be asked (see newClient).
var errNoClient = errors.New("federate: no client session to relay the request to")

// newClient returns the SDK client of one upstream session. ss is the
// client session it belongs to, or nil for the upstream's shared session.
// Its capabilities are the client's (none for a shared session, which
// serves every client and can ask none of them), and what the upstream
// asks of its client is relayed to ss.
//
// A message of a shared session (every stdio upstream's, and the one
// stateless clients use) cannot be attributed to a client: it carries no
// sign of the call it belongs to, and a server may go on working for a
// call after it answered it (or ignore its cancellation), so that even
// the only call in flight need not be its call. So its log messages go to
// mcpgate's log, and its sampling, elicitation and roots requests are
// refused (errNoClient); only its progress, whose token names its call
// (see progressTable), reaches a client.
func (f *Federator) newClient(up *upstream, ss *mcp.ServerSession, w *wireCount) *mcp.Client {
	// target is where a message of upstream session cs goes, and the call
	// it belongs to: the newest call in flight on cs (so that the message
	// travels on that call's stream, before its answer), else ss itself
	// outside any call; nil for a shared session.
	target := func(cs *mcp.ClientSession) (*mcp.ServerSession, *call) {
		if ss == nil {
			return nil, nil
		}
		if c := f.inflight.newest(cs); c != nil {
			return c.ss, c
		}
		return ss, nil
	}
	// asked is where a request of upstream session cs goes, and the calls
	// in flight on cs (oldest first): any of them may be the one whose
	// upstream waits for the answer, as nothing in the request says which.
	asked := func(cs *mcp.ClientSession) (*mcp.ServerSession, []*call) {
		if ss == nil {
			return nil, nil
		}
		return ss, f.inflight.all(cs)
	}
	// logBudget bounds the log messages of a shared session (one process
	// of a stdio upstream) that reach mcpgate's log, as its stderr is.
	var logBudget lineBudget
	caps := &mcp.ClientCapabilities{} // shared: none, since no client can be asked
	if ss != nil {
		caps = &mcp.ClientCapabilities{ // a client that did not say: asked, and it answers
			RootsV2:     &mcp.RootCapabilities{ListChanged: true},
			Sampling:    &mcp.SamplingCapabilities{},
			Elicitation: &mcp.ElicitationCapabilities{},
		}
		if p := ss.InitializeParams(); p != nil && p.Capabilities != nil {
			caps = &mcp.ClientCapabilities{
				RootsV2:     rootsOf(p.Capabilities),
				Sampling:    p.Capabilities.Sampling,
				Elicitation: p.Capabilities.Elicitation,
			}
		}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: f.opts.Name, Version: "1"}, &mcp.ClientOptions{
		Logger:       f.sdkLogger(),
		Capabilities: caps,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			f.spawn(func() { f.refresh(up) })
		},
		PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) {
			f.spawn(func() { f.refresh(up) })
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			f.spawn(func() { f.refresh(up) })
		},
		ResourceUpdatedHandler: func(ctx context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
			// The Federator subscribes on shared sessions only: an update
			// elsewhere (a client's own session), or of a URI up holds no
			// subscription of, is no subscription's, and the SDK server
			// would send it to every subscriber of the URI, whichever
			// upstream serves it.
			if ss != nil || !f.subscribed(up, r.Params.URI) {
				return
			}
			// The SDK server writes to each subscriber in turn: queued,
			// so that a stalled subscriber holds up only the updates.
			f.post(up, "notifications/resources/updated", func() { _ = f.stateful.ResourceUpdated(context.Background(), r.Params) })
		},
		LoggingMessageHandler: func(ctx context.Context, r *mcp.LoggingMessageRequest) {
			to, c := target(r.Session)
			f.relayLog(to, c, up, r.Params, &logBudget)
		},
		ProgressNotificationHandler: func(ctx context.Context, r *mcp.ProgressNotificationClientRequest) {
			f.relayProgress(r.Session, r.Params)
		},
	})
	c.AddReceivingMiddleware(relayRequests(asked, f.opts.RelayWait), countRelayed(w))
	return c
}

// rootsOf is the roots capability a client declared, to declare to its
// upstreams: none if it declared none (an upstream told otherwise would
// ask it for roots it does not have, and wait for changes it never tells).
func rootsOf(caps *mcp.ClientCapabilities) *mcp.RootCapabilities {
	if caps.RootsV2 != nil {
		r := *caps.RootsV2
		return &r
	}
	if caps.Roots.ListChanged { // the SDK fills both; this one alone, to be sure
		return &mcp.RootCapabilities{ListChanged: true}
	}
	return nil
}

// relayRequests sends the upstream's sampling, elicitation and roots
// requests to the client session target returns, as new requests of that
// session: the SDK gives each side its own ids. With no client session (a
// shared session) they are refused with errNoClient.
//
// While a relayed request waits for the client, the idle timeout of every
// call in flight on the upstream session waits too: the request does not
// say which call it is for, and a person may take minutes to answer. See
// relayContext for when the relayed request is cancelled: after wait at
// the latest.
func relayRequests(target func(*mcp.ClientSession) (*mcp.ServerSession, []*call), wait time.Duration) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch method {
			case "sampling/createMessage", "elicitation/create", "roots/list":
			default:
				return next(ctx, method, req)
			}
			cs, _ := req.GetSession().(*mcp.ClientSession)
			ss, calls := target(cs)
			if ss == nil {
				return nil, errNoClient
			}
			for _, c := range calls {
				c.idle.pause()
				defer c.idle.resume()
			}
			ctx, cancel := relayContext(ctx, calls, wait)
			defer cancel()
			switch p := req.GetParams().(type) {
			case *mcp.CreateMessageWithToolsParams:
				return ss.CreateMessageWithTools(ctx, p)
			case *mcp.CreateMessageParams:
				return ss.CreateMessage(ctx, p)
			case *mcp.ElicitParams:
				return ss.Elicit(ctx, p)
			case *mcp.ListRootsParams:
				return ss.ListRoots(ctx, p)
			}
			return nil, fmt.Errorf("federate: cannot relay %s", method)
		}
	}
}

// relayContext is the context to send a relayed request with, and its
// cancel. It travels on the stream of the newest of calls (before that
// call's answer; the client session's own stream when there is no call),
// but does not end with that call: any of calls may be the one waiting for
// the answer. It is cancelled when the upstream cancels its request (up,
// the upstream's context), when every one of calls has ended (none is
// left to want the answer), or after wait (Options.RelayWait). The client
// session ending fails the request in the SDK.
func relayContext(up context.Context, calls []*call, wait time.Duration) (context.Context, context.CancelFunc) {
	base := context.Background()
	if len(calls) > 0 {
		base = context.WithoutCancel(calls[len(calls)-1].parent)
	}
	ctx, cancel := context.WithTimeout(base, wait)
	stops := []func() bool{context.AfterFunc(up, cancel)}
	var left atomic.Int64
	left.Store(int64(len(calls)))
	for _, c := range calls {
		stops = append(stops, context.AfterFunc(c.idle.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// relayLog sends an upstream's log message to ss, on the stream of call c
// when there is one. A message of a shared session (ss nil) goes to
// mcpgate's log instead, at its level: it cannot say whose it is. There
// budget (the session's) bounds them as a process's stderr lines are
// (lineBudget), so that a server logging in a loop through MCP cannot
// flood the log either; the next message logged says how many were
// dropped before it.
func (f *Federator) relayLog(ss *mcp.ServerSession, c *call, up *upstream, p *mcp.LoggingMessageParams, budget *lineBudget) {
	if ss == nil {
		ok, dropped := budget.take(time.Now())
		if !ok {
			return
		}
		attrs := []any{"upstream", up.cfg.Name, "logger", p.Logger, "level", p.Level, "data", p.Data}
		if dropped > 0 {
			attrs = append(attrs, "dropped_before", dropped)
		}
		f.log.Log(context.Background(), slogLevel(p.Level), "upstream log message", attrs...)
		return
	}
	ctx := context.Background()
	if c != nil {
		ctx = c.parent
		c.posted.Store(true)
	}
	f.post(ss, "notifications/message", func() {
		if err := ss.Log(ctx, p); err != nil && c != nil {
			_ = ss.Log(context.Background(), p) // the call has ended: the session's own stream
		}
	})
}

// progressTable maps the progress tokens the Federator sends upstream to
// the client's own token and session: tokens are unique per client
// session, and a shared upstream session carries many clients' calls.
//
// It holds every token retired within progressGrace, about call rate ×
// progressGrace of them, under the lock every call and progress
// notification takes: so the retired tokens wait in a queue in the order
// they were retired, and each add, retire and relay forgets the expired
// ones at its front, never walking the whole table.
type progressTable struct {
	mu   sync.Mutex
	next atomic.Uint64
	m    map[string]progressEntry
	// retired holds the tokens in the order they were retired (their
	// times increase: taken under mu); expire pops them from the front.
	retired []retiredToken
	now     func() time.Time // time.Now; tests set it
}

type progressEntry struct {
	c       *call // while it runs; nil once retired, so the ended call is not kept for progressGrace
	cs      *mcp.ClientSession
	ss      *mcp.ServerSession
	token   any
	retired time.Time // when the call ended; zero while it runs
}

type retiredToken struct {
	ft string
	at time.Time
}

// progressGrace is how long a token stays known after its call ended: the
// SDK client hands notifications to their handler after the response that
// followed them may have been processed, so a call's last progress can
// arrive just after it returned. It then goes to the client's own stream.
const progressGrace = 30 * time.Second

func (t *progressTable) init() { t.m = map[string]progressEntry{} }

func (t *progressTable) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

// add registers the client's token and returns the one to send upstream.
func (t *progressTable) add(c *call, token any) string {
	ft := "mcpgate-" + strconv.FormatUint(t.next.Add(1), 36)
	t.mu.Lock()
	t.expire(t.clock())
	t.m[ft] = progressEntry{c: c, cs: c.cs, ss: c.ss, token: token}
	t.mu.Unlock()
	return ft
}

// retire marks ft's call as ended, and forgets the tokens retired more
// than progressGrace ago.
func (t *progressTable) retire(ft string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock()
	t.expire(now)
	if e, ok := t.m[ft]; ok {
		e.c, e.retired = nil, now
		t.m[ft] = e
		t.retired = append(t.retired, retiredToken{ft: ft, at: now})
	}
}

// expired reports whether e was retired more than progressGrace before now.
func (e *progressEntry) expired(now time.Time) bool {
	return !e.retired.IsZero() && now.Sub(e.retired) > progressGrace
}

// expire forgets the tokens retired more than progressGrace before now:
// those at the front of the queue. Popping reslices: append copies only
// the queued tokens when it outgrows the array (amortised O(1) a token),
// and an empty queue lets its array go. t.mu is held.
func (t *progressTable) expire(now time.Time) {
	for len(t.retired) > 0 && now.Sub(t.retired[0].at) > progressGrace {
		ft := t.retired[0].ft
		// A token retired again since is left to its later place in the queue.
		if e, ok := t.m[ft]; ok && e.expired(now) {
			delete(t.m, ft)
		}
		t.retired[0] = retiredToken{}
		t.retired = t.retired[1:]
	}
	if len(t.retired) == 0 {
		t.retired = nil
	}
}

// lookup returns the entry of ft if it is known and its call is on from.
func (t *progressTable) lookup(from *mcp.ClientSession, ft string) (progressEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(t.clock())
	e, ok := t.m[ft] // expire left no token past progressGrace
	if !ok || e.cs != from {
		return progressEntry{}, false
	}
	return e, true
}

// relayProgress passes a progress notification of upstream session from on
// to the client whose call it is about (through its outbox), and restarts
// that call's idle timeout. A token of a call on another session is
// ignored: an upstream cannot reach into another's calls.
func (f *Federator) relayProgress(from *mcp.ClientSession, p *mcp.ProgressNotificationParams) {
	ft, _ := p.ProgressToken.(string)
	e, ok := f.progress.lookup(from, ft)
	if !ok {
		return
	}
	out := *p
	out.ProgressToken = e.token
	ctx := context.Background()
	if e.c != nil {
		e.c.idle.touch()
		e.c.posted.Store(true)
		ctx = e.c.parent
	}
	f.post(e.ss, "notifications/progress", func() {
		if e.ss.NotifyProgress(ctx, &out) != nil && e.c != nil {
			_ = e.ss.NotifyProgress(context.Background(), &out) // the call has ended: the session's own stream
		}
	})
}

// sessionTable holds each client session's upstream sessions.
type sessionTable struct {
	mu sync.Mutex
	m  map[*mcp.ServerSession]*clientSet
}

// clientSet is one client session's upstream sessions.
type clientSet struct {
	mu    sync.Mutex
	byUp  map[*upstream]*sessionSlot
	level mcp.LoggingLevel // the client's logging/setLevel, applied to new sessions
	done  bool
}

// sessionSlot is one upstream session of one client; its lock is held
// while it connects, so a client's concurrent first calls open one
// session, not several. A failed session is cleared without the lock (see
// call.drop): a connection may hold it up to its idle timeout.
type sessionSlot struct {
	mu sync.Mutex
	cs atomic.Pointer[mcp.ClientSession]
	// client is cs's SDK client (set with cs, left after a drop): the
	// one way to send cs a notifications/roots/list_changed.
	client atomic.Pointer[mcp.Client]
}

func (t *sessionTable) init() { t.m = map[*mcp.ServerSession]*clientSet{} }

// clientSetOf returns ss's set, creating it (and the watch that closes its
// sessions when ss ends) on first use; nil once ss has ended.
func (f *Federator) clientSetOf(ss *mcp.ServerSession) *clientSet {
	t := &f.sessions
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.m[ss]; ok {
		return s
	}
	if f.ctx.Err() != nil {
		return nil
	}
	s := &clientSet{byUp: map[*upstream]*sessionSlot{}}
	t.m[ss] = s
	f.spawn(func() {
		_ = ss.Wait()
		t.mu.Lock()
		delete(t.m, ss)
		t.mu.Unlock()
		s.closeAll()
	})
	return s
}

func (s *clientSet) slot(up *upstream) (*sessionSlot, mcp.LoggingLevel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil, ""
	}
	sl, ok := s.byUp[up]
	if !ok {
		sl = &sessionSlot{}
		s.byUp[up] = sl
	}
	return sl, s.level
}

func (s *clientSet) closeAll() {
	s.mu.Lock()
	s.done = true
	slots := s.byUp
	s.byUp = map[*upstream]*sessionSlot{}
	s.mu.Unlock()
	for _, sl := range slots {
		sl.mu.Lock()
		if cs := sl.cs.Swap(nil); cs != nil {
			_ = cs.Close()
		}
		sl.mu.Unlock()
	}
}

// closeAll ends every client session (which closes their upstream
// sessions).
func (t *sessionTable) closeAll() {
	for _, s := range t.all() {
		s.closeAll()
	}
}

// all returns the client sets, to work on without t.mu.
func (t *sessionTable) all() []*clientSet {
	t.mu.Lock()
	defer t.mu.Unlock()
	sets := make([]*clientSet, 0, len(t.m))
	for _, s := range t.m {
		sets = append(sets, s)
	}
	return sets
}

// usesShared reports whether a call of ss to up goes through up's shared
// session: a stdio upstream, or a client without sessions.
func usesShared(up *upstream, ss *mcp.ServerSession, stateless bool) bool {
	return stateless || ss == nil || up.cfg.stdio()
}

// session returns the upstream session a call of ss goes through: ss's
// own (opened now if it has none) for an HTTP upstream and a client with
// sessions, with the slot holding it; the shared one otherwise (no slot).
func (f *Federator) session(ctx context.Context, up *upstream, ss *mcp.ServerSession, stateless bool) (*mcp.ClientSession, *sessionSlot, error) {
	if usesShared(up, ss, stateless) {
		cs, err := up.sharedSession(ctx)
		return cs, nil, err
	}
	set := f.clientSetOf(ss)
	if set == nil {
		return nil, nil, errSessionEnded
	}
	sl, level := set.slot(up)
	if sl == nil {
		return nil, nil, errSessionEnded
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if cs := sl.cs.Load(); cs != nil {
		return cs, sl, nil
	}
	cs, client, err := up.connect(ctx, ss)
	if err != nil {
		return nil, nil, err
	}
	if level != "" && hasLogging(cs) {
		_ = cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level})
	}
	sl.client.Store(client)
	sl.cs.Store(cs)
	return cs, sl, nil
}

// rootsChangedMarker is the root Federator.rootsChanged adds to an
// upstream session's SDK client to make it send
// notifications/roots/list_changed (the SDK sends it on AddRoots, even of
// a root it has, and offers no other way). The client's own list is never
// read: the upstream's roots/list is relayed to the client (see
// relayRequests).
var rootsChangedMarker = &mcp.Root{URI: "urn:mcpgate:roots-changed", Name: "unused"}

// rootsChanged passes a client's notifications/roots/list_changed on to
// its own upstream sessions, which told their upstreams it sends them (its
// roots capability, see newClient): an upstream that keeps the client's
// roots lists them again (roots/list, relayed to the client). The shared
// sessions declare no roots. In the background: notifying an upstream
// must not hold up the client's session.
func (f *Federator) rootsChanged(_ context.Context, r *mcp.RootsListChangedRequest) {
	f.sessions.mu.Lock()
	set := f.sessions.m[r.Session]
	f.sessions.mu.Unlock()
	if set == nil {
		return // no upstream session yet: one opened later asks the roots anew
	}
	set.mu.Lock()
	var clients []*mcp.Client
	for _, sl := range set.byUp {
		if c := sl.client.Load(); c != nil && sl.cs.Load() != nil {
			clients = append(clients, c)
		}
	}
	set.mu.Unlock()
	for _, c := range clients {
		f.spawn(func() { c.AddRoots(rootsChangedMarker) })
	}
}

// setLevel passes a client's logging/setLevel on to its upstream sessions
// and to the shared ones (where the last client to set a level wins; their
// messages go to mcpgate's log, see newClient).
func (f *Federator) setLevel(ctx context.Context, ss *mcp.ServerSession, level mcp.LoggingLevel) {
	var own []*mcp.ClientSession
	if set := f.clientSetOf(ss); set != nil {
		set.mu.Lock()
		set.level = level
		slots := make([]*sessionSlot, 0, len(set.byUp))
		for _, sl := range set.byUp {
			slots = append(slots, sl)
		}
		set.mu.Unlock()
		for _, sl := range slots {
			sl.mu.Lock() // a session connecting gets the level: wait for it
			own = append(own, sl.cs.Load())
			sl.mu.Unlock()
		}
	}
	for _, up := range f.ups {
		up.mu.Lock()
		if up.shared != nil {
			own = append(own, up.shared)
		}
		up.mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, cs := range own {
		if cs != nil && hasLogging(cs) {
			wg.Go(func() {
				// Bounded, and each upstream on its own: one that hangs
				// must not hold the client's logging/setLevel.
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setLevelTimeout)
				defer cancel()
				_ = cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level})
			})
		}
	}
	wg.Wait()
}

// setLevelTimeout bounds passing a logging/setLevel on to one upstream.
const setLevelTimeout = 5 * time.Second

// inflightTable holds the calls in flight on each upstream session, oldest
// first: on a client's own session, the newest is the stream its log
// messages and requests go on.
type inflightTable struct {
	mu sync.Mutex
	m  map[*mcp.ClientSession][]*call
}

func (t *inflightTable) add(c *call) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[*mcp.ClientSession][]*call{}
	}
	t.m[c.cs] = append(t.m[c.cs], c)
	t.mu.Unlock()
}

func (t *inflightTable) remove(c *call) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.m[c.cs]
	for i := len(l) - 1; i >= 0; i-- {
		if l[i] == c {
			l = append(l[:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(t.m, c.cs)
	} else {
		t.m[c.cs] = l
	}
}

// all is the calls in flight on cs, oldest first (a copy).
func (t *inflightTable) all(cs *mcp.ClientSession) []*call {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*call(nil), t.m[cs]...)
}

// newest is the newest call in flight on cs (nil if none).
func (t *inflightTable) newest(cs *mcp.ClientSession) *call {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.m[cs]; len(l) > 0 {
		return l[len(l)-1]
	}
	return nil
}

// hasLogging reports whether the upstream of cs declared logging (an
// upstream may leave capabilities out altogether).
func hasLogging(cs *mcp.ClientSession) bool {
	r := cs.InitializeResult()
	return r != nil && r.Capabilities != nil && r.Capabilities.Logging != nil
}

// slogLevel is the slog level of an MCP log level (RFC 5424 severities):
// notice is info; critical, alert and emergency are errors.
func slogLevel(l mcp.LoggingLevel) slog.Level {
	switch l {
	case "debug":
		return slog.LevelDebug
	case "info", "notice":
		return slog.LevelInfo
	case "warning":
		return slog.LevelWarn
	case "error", "critical", "alert", "emergency":
		return slog.LevelError
	}
	return slog.LevelInfo
}
