package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/enforce"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/mcp"
)

// Live upstream sessions are capped per tenant and per subject
// (sessions.max_per_tenant, sessions.max_per_subject). An admitted
// initialize takes one slot of each, in the same atomic batch as its rate
// rules, with the limit store's concurrency algorithm: a slot is held under
// a lease that expires after sessions.idle_timeout unless renewed. The lease
// travels in the session id the client sees (sessionBinder.wrapLease), so
// any instance can renew it while the session is used and release it on
// DELETE. Each instance tracks the sessions it serves (sessionTracker): it
// renews their leases while they are used and ends them upstream when they
// stay unused for idle_timeout. docs/design.md describes the behaviour with
// several instances.

// DefaultMaxTrackedSessions bounds the sessions one instance tracks. A
// session beyond it still works and its slot is still released on DELETE,
// but this instance neither renews its lease (it lapses idle_timeout after
// its last renewal elsewhere) nor ends it when idle.
const DefaultMaxTrackedSessions = 100_000

// endTimeout bounds the DELETE that ends an idle session upstream.
const endTimeout = 10 * time.Second

// startSessions starts the session tracker's sweeper; Close stops it, and
// waits for the sessions being ended after their upstream's 404 (endLost).
func (g *Gateway) startSessions() {
	g.tracker = newSessionTracker(g, 0)
	ctx, cancel := context.WithCancel(context.Background())
	g.stopSweep, g.sweepDone = cancel, make(chan struct{})
	go func() {
		defer close(g.sweepDone)
		g.tracker.run(ctx)
		g.tracker.mu.Lock()
		g.tracker.closed = true // no ending starts after: ends.Wait below is the last
		g.tracker.mu.Unlock()
		g.tracker.ends.Wait() // each bounded by endTimeout and releaseTimeout
	}()
}

// openSession forwards an admitted initialize that holds session slots
// under the ticket's lease (enforce.Ticket.SessionSlots). The slots are freed at once when the upstream opens no
// session (a stateless upstream, or a failure); otherwise the session id
// the client gets carries the lease and the session is tracked.
func (g *Gateway) openSession(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay, p auth.Principal, t *enforce.Ticket, class string) {
	slots := t.SessionSlots()
	inID := ""
	if slots.Portable() {
		inID = slots.Lease() // a fallback lease is valid on this instance only
	}
	var up *string // the session the upstream opened; session runs on this goroutine (relayUpstream)
	fwd.session = func(upstream string) string {
		up = &upstream
		return g.sessions.wrapLease(p, upstream, inID)
	}
	// The version the session speaks is the one the upstream answered, not
	// the one the client asked for: the gateway's own requests in the
	// session (the DELETE that ends it) carry it.
	var protocol string // answered runs on this goroutine too
	report := fwd.answered
	fwd.answered = func(result, rpcErr json.RawMessage) {
		protocol = negotiated(result)
		if report != nil {
			report(result, rpcErr)
		}
	}
	// The upstream may open the session whatever the client does meanwhile:
	// the request goes on when the client hangs up (bounded by the proxy's
	// timeouts), so that the session it opened is known and ended.
	status := g.forward(w, r.WithContext(context.WithoutCancel(r.Context())), rt, fwd, class)
	if up == nil || status >= http.StatusMultipleChoices {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
		slots.Release(ctx)
		cancel()
		if up != nil { // opened upstream, but the client never got it
			g.tracker.endGone(context.WithoutCancel(r.Context()), sweepJob{upstream: *up, tenant: p.Tenant, subject: p.Subject, protocol: protocol})
		}
		return
	}
	g.tracker.add(*up, p, slots, protocol, true)
}

// negotiated is the protocolVersion of an initialize's result, "" when it
// names none.
func negotiated(result json.RawMessage) string {
	var r struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if json.Unmarshal(result, &r) != nil {
		return ""
	}
	return r.ProtocolVersion
}

// useSession runs for every request naming a session the caller owns,
// before it is forwarded. A DELETE frees the session's slots; any other
// request marks the session used until done is called with the request's
// message (nil for none). ok is false when the session has ended (its
// slots lapsed or were released) and a 404 was written: MCP's answer that
// tells the client to start a new session.
func (g *Gateway) useSession(w http.ResponseWriter, r *http.Request, p auth.Principal, upstream, lease string) (_ http.ResponseWriter, done func(*mcp.Message), ok bool) {
	if r.Method == http.MethodDelete {
		// The slots are freed once the upstream has ended the session (2xx)
		// or says it is gone (404). An upstream that refuses the DELETE
		// (405: MCP lets a server keep its sessions) or fails keeps the
		// session, and so its slots, until the idle sweep ends it. Its
		// answer is the upstream's to this very DELETE: nothing is sent
		// again.
		sw := &statusWriter{ResponseWriter: w}
		return sw, func(*mcp.Message) {
			if sw.status/100 == 2 || sw.status == http.StatusNotFound {
				g.freeSession(context.WithoutCancel(r.Context()), p, upstream, lease)
			}
		}, true
	}
	e, live := g.tracker.enter(r.Context(), upstream, p, g.eng.SessionSlotsOf(p.Tenant, p.Subject, lease))
	if !live {
		g.metrics.Requests.WithLabelValues("any", "bad_session").Inc()
		mcp.WriteError(w, http.StatusNotFound, nil, mcp.CodeInvalidRequest, "session ended: start a new one", nil)
		return w, nil, false
	}
	// MCP: a server that ended a session answers its requests 404. Its
	// slots are freed then, as for a DELETE the upstream answers 404, once
	// the gateway has made sure of it (endLost).
	sw := &sessionWriter{statusWriter: statusWriter{ResponseWriter: w}}
	return sw, func(msg *mcp.Message) {
		g.tracker.done(e)
		if sw.status/100 == 2 {
			// A version the upstream took (unless the gateway answered
			// itself: learn says what comes of one it did not).
			g.tracker.learn(e, r.Header.Get(mcp.HeaderProtocolVersion))
		}
		if sw.endsSession(msg) {
			g.endLost(r, p, upstream, lease)
		}
	}, true
}

// freeSession forgets a session that is gone upstream and frees its slots.
func (g *Gateway) freeSession(ctx context.Context, p auth.Principal, upstream, lease string) {
	e := g.tracker.remove(upstream)
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	g.eng.SessionSlotsOf(p.Tenant, p.Subject, lease).Release(ctx)
	g.tracker.bury(upstream, lease)
	if e != nil && e.slots.Held() && e.slots.Lease() != lease {
		e.slots.Release(ctx)
		g.tracker.bury(upstream, e.slots.Lease())
	}
}

// endLost ends upstream a session whose upstream answered one of its
// requests 404 (sessionWriter.endsSession), and frees its slots only if
// the upstream then ended it (2xx) or did not know it (404): a 404 is
// whatever the upstream says it is, and a freed slot must mean a session
// gone upstream, or each slot could open any number of them. An upstream
// that refuses that DELETE (405) or fails keeps the session tracked, and
// its slots held, until the idle sweep ends it, as for a client's DELETE.
// The DELETE runs after the answer, which it would hold for up to
// endTimeout; the caller's next initialize waits for its outcome
// (awaitEnds), and Close for the DELETE itself.
func (g *Gateway) endLost(r *http.Request, p auth.Principal, upstream, lease string) {
	ctx := context.WithoutCancel(r.Context())
	// The request's version was sent upstream and answered 404, not
	// refused; the session's own is surer.
	protocol := cmp.Or(g.tracker.protocolOf(upstream), r.Header.Get(mcp.HeaderProtocolVersion))
	j := sweepJob{upstream: upstream, tenant: p.Tenant, subject: p.Subject, protocol: protocol}
	done, ok := g.tracker.ending(p, upstream)
	if !ok {
		return // already being ended: its outcome frees the slots or keeps them
	}
	go func() {
		defer done()
		if gone, _ := g.tracker.endGone(ctx, j); gone {
			g.freeSession(ctx, p, upstream, lease)
		}
	}()
}

// endGone ends a session upstream (DELETE, in the version it negotiated
// when known) and reports whether it is gone there: ended (2xx) or
// unknown (404); status is the upstream's answer, 0 when it failed. Any
// other answer leaves it open: MCP lets a server refuse a DELETE (405).
// Only a session it ended counts in mcpgate_upstream_sessions_ended_total.
func (t *sessionTracker) endGone(ctx context.Context, j sweepJob) (gone bool, status int) {
	ctx, cancel := context.WithTimeout(ctx, endTimeout)
	defer cancel()
	status, err := t.g.askUpstream(ctx, t.hc, http.MethodDelete, j.tenant, j.subject, j.upstream, j.protocol, nil)
	switch {
	case err != nil:
		t.g.log.Warn("ending a session upstream failed", "tenant", j.tenant, "err", err)
		return false, 0
	case status/100 == 2:
		t.g.metrics.SessionsEnded.Inc()
		return true, status
	case status == http.StatusNotFound:
		return true, status
	}
	t.g.log.Warn("the upstream did not end a session", "tenant", j.tenant, "status", status)
	return false, status
}

// maxEndBody bounds the part of a 404's body a sessionWriter keeps: an
// answer to the request is a JSON-RPC error, far shorter. One that is
// longer is read as the session's end, which the gateway then makes sure
// of (endLost).
const maxEndBody = 16 << 10

// sessionWriter is a statusWriter for the answer to a request in a
// session that also keeps the start of its body when the status is 404,
// which endsSession reads.
type sessionWriter struct {
	statusWriter
	body []byte // the start of a 404's body, up to maxEndBody
}

// Write records what a 404 carries.
func (s *sessionWriter) Write(p []byte) (int, error) {
	n, err := s.statusWriter.Write(p) // sets an implicit 200 first
	if s.status == http.StatusNotFound && len(s.body) < maxEndBody {
		s.body = append(s.body, p[:min(len(p), maxEndBody-len(s.body))]...)
	}
	return n, err
}

// endsSession reports whether the answer to msg (nil: a request without a
// message) says the session is gone: a 404 that is not msg's own JSON-RPC
// response. MCP 2026-07-28 answers an unknown method 404 with that
// response (the Go SDK does so inside a session too), while a server that
// no longer knows the session answers with plain text (the Go SDK's
// "session not found") or an error for no request (the TypeScript SDK's id
// null). Read as the session's end, the former let a client free its slot
// at will and open another session.
func (s *sessionWriter) endsSession(msg *mcp.Message) bool {
	if s.status != http.StatusNotFound {
		return false
	}
	if !msg.IsCall() {
		return true
	}
	m, err := mcp.Parse(s.body)
	return err != nil || m.Kind != mcp.Response || !mcp.SameID(m.ID, msg.ID)
}

// sessionEntry is one session an instance tracks. Its fields are guarded by
// the tracker's mutex.
type sessionEntry struct {
	upstream         string // the upstream's session id
	tenant, subject  string
	slots            enforce.SessionSlots // none when the session holds no slot
	protocol         string               // the version of the gateway's DELETE (see negotiated)
	active           int                  // requests in progress
	lastUse          time.Time            // when the last request began or ended
	renewed          time.Time            // when this instance last took or renewed the lease
	ownUntil         time.Time            // when the lease this instance last took or renewed runs out (leaseEnd)
	usedSinceRenewal bool
	dead             bool      // its slots are gone: the next request gets 404
	touched          time.Time // when the sweep last pinged it in the federation (or first met it)
	asks             uint64    // questions relayed on its GET stream and answers its clients POSTed (askedClient)
	// negotiated: protocol is the version the session negotiated (its
	// initialize's answer); else, for a session opened elsewhere, it is
	// the first one of its requests answered 2xx (learn). Never a client's
	// header the upstream did not take: it would refuse the DELETE (the
	// go-sdk answers 400) and the session would live on.
	negotiated bool
	// ending: the sweep is ending it (endIdle); a DELETE that did not end
	// it is sent again one idle_timeout later (nextEnd), maxEndTries
	// times in all.
	ending   bool
	endTries int
	nextEnd  time.Time
}

// sessionTracker is an instance's view of the sessions it serves. It is
// safe for concurrent use; run drives its sweeps.
type sessionTracker struct {
	g   *Gateway
	max int
	mu  sync.Mutex
	m   map[string]*sessionEntry // by upstream session id
	hc  *http.Client
	now func() time.Time
	// fullWarned is when the "too many sessions" warning was last logged,
	// and untracked how many requests it has met since: at the cap, every
	// request of every untracked session meets it.
	fullWarned time.Time
	untracked  int64
	// lost holds, by caller and upstream session id, the sessions being
	// ended after their upstream's 404 (endLost): each channel is closed
	// when its ending is over. ends counts them for Close.
	lost map[lostKey]map[string]chan struct{}
	ends sync.WaitGroup
	// closed: the gateway is closing, no ending starts any more (a
	// handler still running then gets its 404, the session left to the
	// upstream's own timeout).
	closed bool
	// buried holds the untracked sessions whose lease is known gone
	// (tombstones), so that a client naming one again and again gets its
	// 404 without a store round trip each time (enter); graves keeps them
	// in the order they were buried, the oldest replaced first once it
	// holds maxBuried. A lease once gone is never held again (Renew does
	// not take it back, and no Take returns it twice): a tombstone never
	// turns a live session away.
	buried map[grave]struct{}
	graves []grave
	oldest int // the next grave replaced, once graves is full
}

// grave names a session whose lease is gone.
type grave struct{ upstream, lease string }

// maxBuried bounds the tombstones a tracker keeps: a session buried longer
// ago is checked in the store again, and found gone again.
const maxBuried = 4096

// lostKey is the caller whose sessions lost holds.
type lostKey struct{ tenant, subject string }

// fullWarnEvery is how often at most a full tracker says so.
const fullWarnEvery = time.Minute

func newSessionTracker(g *Gateway, size int) *sessionTracker {
	if size <= 0 {
		size = DefaultMaxTrackedSessions
	}
	return &sessionTracker{g: g, max: size, m: map[string]*sessionEntry{}, lost: map[lostKey]map[string]chan struct{}{}, now: time.Now,
		buried: map[grave]struct{}{},
		hc:     &http.Client{Transport: g.fed.transport(), Timeout: endTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// add records a session that was just opened (opened) or first seen here;
// protocol is the version it negotiated, "" when unknown.
func (t *sessionTracker) add(upstream string, p auth.Principal, slots enforce.SessionSlots, protocol string, opened bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.addLocked(upstream, p, slots, protocol, opened)
}

// addLocked is add under the tracker's lock; it returns the session's
// entry, nil when the tracker is full.
func (t *sessionTracker) addLocked(upstream string, p auth.Principal, slots enforce.SessionSlots, protocol string, opened bool) *sessionEntry {
	now := t.now()
	e := t.m[upstream]
	if e == nil {
		if len(t.m) >= t.max {
			t.untracked++
			if now.Sub(t.fullWarned) >= fullWarnEvery {
				t.g.log.Warn("too many sessions tracked on this instance: sessions beyond it are not renewed nor ended when idle",
					"max", t.max, "untracked_requests", t.untracked)
				t.fullWarned, t.untracked = now, 0
			}
			return nil
		}
		e = &sessionEntry{upstream: upstream, tenant: p.Tenant, subject: p.Subject, lastUse: now}
		t.m[upstream] = e
		t.g.metrics.UpstreamSessions.Set(float64(len(t.m)))
	}
	if slots.Held() && !e.slots.Held() {
		e.slots = slots
	}
	if opened {
		e.renewed = now // the lease was just taken
		e.ownUntil = t.leaseEnd(now)
	} else {
		e.usedSinceRenewal = true
	}
	if protocol != "" {
		e.protocol, e.negotiated = protocol, true
	}
	return e
}

// learn records protocol, the MCP-Protocol-Version of a request of e
// answered 2xx, as the version of a session whose negotiated one is
// unknown here (opened through another instance), unless one was learnt
// already. A 2xx the gateway answered itself (a cached result) proves
// nothing: a DELETE the upstream refuses 400 forgets it (endRefused).
func (t *sessionTracker) learn(e *sessionEntry, protocol string) {
	if e == nil || protocol == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.protocol == "" {
		e.protocol = protocol
	}
}

// protocolOf is the version tracked for upstream, "" if none.
func (t *sessionTracker) protocolOf(upstream string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[upstream]; e != nil {
		return e.protocol
	}
	return ""
}

// enter marks upstream in use by one request of p; live is false when the
// session has ended. A session this instance does not track (dropped by
// the sweep or after a 404, or used here for the first time) is tracked
// anew only if its slots are still held (vouch): tracking it blindly would
// serve a session that holds no slot, one more than the caps allow. Its
// lease may well be held: another instance, sharing the store, took it or
// renews it. The check runs once per session and instance (and on each
// request of a session the full tracker cannot hold).
func (t *sessionTracker) enter(ctx context.Context, upstream string, p auth.Principal, slots enforce.SessionSlots) (e *sessionEntry, live bool) {
	if e, live, known := t.useKnown(upstream, p, slots, !slots.Held()); known {
		return e, live
	}
	if !t.vouch(ctx, upstream, p, slots) {
		return nil, false
	}
	return t.use(upstream, p, slots)
}

// use marks upstream in use by one request, tracking it if it is not: for
// a session whose slots are vouched for (enter) or that holds none.
func (t *sessionTracker) use(upstream string, p auth.Principal, slots enforce.SessionSlots) (e *sessionEntry, live bool) {
	e, live, _ = t.useKnown(upstream, p, slots, true)
	return e, live
}

// useKnown marks upstream in use, and reports known: whether it could
// tell, without the store, if the session lives. It cannot for a session
// it does not track when track is false, unless its lease is buried.
func (t *sessionTracker) useKnown(upstream string, p auth.Principal, slots enforce.SessionSlots, track bool) (e *sessionEntry, live, known bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[upstream] == nil {
		if _, gone := t.buried[grave{upstream, slots.Lease()}]; gone && slots.Held() {
			return nil, false, true
		}
		if !track {
			return nil, false, false
		}
	}
	e = t.addLocked(upstream, p, slots, "", false)
	if e == nil {
		return nil, true, true // not tracked (the tracker is full)
	}
	if e.dead {
		if !e.ending { // else the sweep still has to end it upstream
			t.buryLocked(upstream, e.slots.Lease()) // its renewal found the lease gone
			t.dropLocked(upstream)
		}
		return nil, false, true
	}
	e.active++
	e.lastUse = t.now()
	return e, true, true
}

// vouch reports whether the slots of upstream, a session of p this
// instance does not track, are still held, and buries the session when they are
// not. A store that does not answer vouches for it: the sweep's renewal of
// the session, tracked from then on, asks again (renew). A check cut
// short by its request (the client hung up) vouches for nothing: else any
// client could have a session without a slot served by hanging up at once.
func (t *sessionTracker) vouch(ctx context.Context, upstream string, p auth.Principal, slots enforce.SessionSlots) bool {
	cctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	held, err := slots.Check(cctx)
	cancel()
	if err != nil && ctx.Err() != nil {
		return false // the request is over: its answer reaches no one
	}
	if err != nil {
		t.g.log.Warn("checking the slot of a session new to this instance failed: served, checked again at the next sweep",
			"tenant", p.Tenant, "err", err)
		return true
	}
	if !held {
		t.bury(upstream, slots.Lease())
	}
	return held
}

// bury records that the lease of upstream is gone (see buried).
func (t *sessionTracker) bury(upstream, lease string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buryLocked(upstream, lease)
}

func (t *sessionTracker) buryLocked(upstream, lease string) {
	k := grave{upstream, lease}
	if _, ok := t.buried[k]; ok || lease == "" {
		return
	}
	if len(t.graves) < maxBuried {
		t.graves = append(t.graves, k)
	} else {
		delete(t.buried, t.graves[t.oldest])
		t.graves[t.oldest] = k
		t.oldest = (t.oldest + 1) % maxBuried
	}
	t.buried[k] = struct{}{}
}

// done ends one request of e (nil: an untracked session).
func (t *sessionTracker) done(e *sessionEntry) {
	if e == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e.active--
	e.lastUse, e.usedSinceRenewal = t.now(), true
}

// remove stops tracking upstream and returns its entry, if any.
func (t *sessionTracker) remove(upstream string) *sessionEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[upstream]
	t.dropLocked(upstream)
	return e
}

func (t *sessionTracker) dropLocked(upstream string) {
	delete(t.m, upstream)
	t.g.metrics.UpstreamSessions.Set(float64(len(t.m)))
}

// ending records that p's upstream session is being ended (endLost) until
// done is called. ok is false when it already is: every request of a lost
// session gets the upstream's 404, and one DELETE ends it (a DELETE each
// would pile up against a slow upstream, the client no longer waiting).
func (t *sessionTracker) ending(p auth.Principal, upstream string) (done func(), ok bool) {
	k := lostKey{p.Tenant, p.Subject}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, busy := t.lost[k][upstream]; busy || t.closed {
		return nil, false
	}
	if t.lost[k] == nil {
		t.lost[k] = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	t.lost[k][upstream] = ch
	t.ends.Add(1)
	return func() {
		t.mu.Lock()
		delete(t.lost[k], upstream)
		if len(t.lost[k]) == 0 {
			delete(t.lost, k)
		}
		close(ch)
		t.mu.Unlock()
		t.ends.Done()
	}, true
}

// maxEndWait bounds awaitEnds: one ending's DELETE and slot release.
const maxEndWait = endTimeout + releaseTimeout

// awaitEnds waits until the sessions of p being ended on this instance
// when it is called (endLost) are, for maxEndWait at most, or ctx ends. An
// initialize does, before it is admitted: a client told 404 starts a new
// session at once, and must find the slot of the one it lost free, unless
// the upstream kept that session. Endings that start meanwhile are not
// waited for: another client of the same subject losing sessions one after
// the other must not hold this one's initialize.
func (t *sessionTracker) awaitEnds(ctx context.Context, p auth.Principal) {
	t.mu.Lock()
	var running []chan struct{}
	for _, ch := range t.lost[lostKey{p.Tenant, p.Subject}] {
		running = append(running, ch)
	}
	t.mu.Unlock()
	if len(running) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, maxEndWait)
	defer cancel()
	for _, ch := range running {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}
