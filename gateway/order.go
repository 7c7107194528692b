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
type sessionOrder struct {
	wait    time.Duration
	mu      sync.Mutex
	opening map[string]*openingGET // by upstream session id
	waiting atomic.Int64           // POSTs waiting now
}

// openingGET is the GETs of one session not yet accepted upstream.
type openingGET struct {
	n        int
	accepted chan struct{} // closed when n falls to 0
}

func newSessionOrder(wait time.Duration) *sessionOrder {
	return &sessionOrder{wait: wait, opening: make(map[string]*openingGET)}
}

// open records a GET of session being forwarded. The function returned marks
// it accepted (or failed); it may be called more than once.
func (o *sessionOrder) open(session string) (accepted func()) {
	if session == "" {
		return func() {}
	}
	o.mu.Lock()
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
// after o.wait, or when ctx is done, whichever comes first.
func (o *sessionOrder) await(ctx context.Context, session string) {
	if session == "" {
		return
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

// serveOrdered is rt.proxy.Serve under the session order: a GET is
// recorded until the upstream accepts it, a POST first awaits its session's
// GET.
func (g *Gateway) serveOrdered(w http.ResponseWriter, r *http.Request, rt *runtime, fwd mcp.Forward) (int, error) {
	session := r.Header.Get(mcp.HeaderSessionID)
	switch r.Method {
	case http.MethodGet:
		accepted := g.order.open(session)
		defer accepted()
		fwd.OnResponse = accepted
	case http.MethodPost:
		g.order.await(r.Context(), session)
	}
	return rt.proxy.Serve(w, r, fwd)
}
