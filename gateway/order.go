package gateway

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/mcp"
)

// defaultOrderWait bounds how long a session's POST waits for the session's
// GET stream to be accepted upstream.
const defaultOrderWait = 2 * time.Second

// sessionOrder keeps the order of a session's requests where it matters. A
// client opens the GET stream and then POSTs; the two travel on separate
// connections, and a POST that overtakes the GET on the way upstream may
// make the upstream send a server→client request (sampling, elicitation)
// while no stream is there to carry it: the request is lost. So while a
// session's GET is forwarded and not yet accepted upstream (its response
// headers not received), a POST of that session waits, at most wait, then
// proceeds. Other sessions never wait. Entries live while a GET is being
// accepted. Safe for concurrent use.
//
// The client fires its GET when the answer to notifications/initialized
// arrives and may send its first request at once, on another connection:
// that request can reach the gateway before the GET does (seen with the
// TypeScript SDK client, a few milliseconds apart). So for grace after a
// session's initialized notification was answered, a request of that
// session that finds no GET yet waits (at most the rest of grace) for one
// to arrive. A client that opens no GET pays this once, on a request sent
// within grace of its initialization.
type sessionOrder struct {
	wait    time.Duration
	grace   time.Duration
	mu      sync.Mutex
	opening map[string]*openingGET // by upstream session id
	fresh   map[string]*freshSession
	waiting atomic.Int64 // requests waiting now
}

// freshSession is a session initialized less than grace ago whose GET has
// not arrived.
type freshSession struct {
	until time.Time
	got   chan struct{} // closed when the session's first GET arrives
}

// openingGET is the GETs of one session not yet accepted upstream.
type openingGET struct {
	n        int
	accepted chan struct{} // closed when n falls to 0
}

func newSessionOrder(wait time.Duration) *sessionOrder {
	return &sessionOrder{wait: wait, grace: defaultGETGrace, opening: make(map[string]*openingGET), fresh: make(map[string]*freshSession)}
}

// defaultGETGrace is how long after its initialization a session's request
// waits for the session's first GET.
const defaultGETGrace = 200 * time.Millisecond

// initialized records that session's notifications/initialized was
// answered: its client is about to open the GET stream.
func (o *sessionOrder) initialized(session string) {
	if session == "" || o.grace <= 0 {
		return
	}
	f := &freshSession{until: time.Now().Add(o.grace), got: make(chan struct{})}
	o.mu.Lock()
	if _, ok := o.fresh[session]; !ok {
		o.fresh[session] = f
		time.AfterFunc(o.grace, func() { o.forgetFresh(session, f) })
	}
	o.mu.Unlock()
}

func (o *sessionOrder) forgetFresh(session string, f *freshSession) {
	o.mu.Lock()
	if o.fresh[session] == f {
		delete(o.fresh, session)
	}
	o.mu.Unlock()
}

// open records a GET of session being forwarded. The function returned marks
// it accepted (or failed); it may be called more than once.
func (o *sessionOrder) open(session string) (accepted func()) {
	if session == "" {
		return func() {}
	}
	o.mu.Lock()
	if f := o.fresh[session]; f != nil {
		delete(o.fresh, session)
		close(f.got)
	}
	g := o.opening[session]
	if g == nil {
		g = &openingGET{accepted: make(chan struct{})}
		o.opening[session] = g
	}
	g.n++
	o.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			o.mu.Lock()
			defer o.mu.Unlock()
			if g.n--; g.n == 0 {
				delete(o.opening, session)
				close(g.accepted)
			}
		})
	}
}

// await returns once no GET of session is waiting to be accepted upstream,
// after o.wait, or when ctx is done, whichever comes first. A request (not
// a notification) of a session initialized less than grace ago first waits
// for the session's first GET to arrive, until grace has passed.
func (o *sessionOrder) await(ctx context.Context, session string, request bool) {
	if session == "" {
		return
	}
	o.mu.Lock()
	f := o.fresh[session]
	o.mu.Unlock()
	if f != nil && request {
		o.waiting.Add(1)
		t := time.NewTimer(time.Until(f.until))
		select {
		case <-f.got:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		o.waiting.Add(-1)
	}
	o.mu.Lock()
	g := o.opening[session]
	o.mu.Unlock()
	if g == nil {
		return
	}
	o.waiting.Add(1)
	defer o.waiting.Add(-1)
	t := time.NewTimer(o.wait)
	defer t.Stop()
	select {
	case <-g.accepted:
	case <-t.C:
	case <-ctx.Done():
	}
}

// serveOrdered is serveUpstream under the session order: a GET is
// recorded until the upstream accepts it, a POST first awaits its session's
// GET.
func (g *Gateway) serveOrdered(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay) (int, error) {
	session := r.Header.Get(mcp.HeaderSessionID)
	switch r.Method {
	case http.MethodGet:
		if fwd.accepted == nil { // serveMCP records it as soon as it knows the session
			accepted := g.order.open(session)
			defer accepted()
			fwd.accepted = accepted
		}
	case http.MethodPost:
		g.order.await(r.Context(), session, fwd.Msg.IsCall())
	}
	status, err := g.serveUpstream(w, r, rt, fwd)
	if r.Method == http.MethodPost && err == nil && status/100 == 2 && fwd.Msg != nil && fwd.Msg.Method == mcp.MethodInitialized {
		g.order.initialized(session)
	}
	return status, err
}
