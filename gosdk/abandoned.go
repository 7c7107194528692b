package gosdk

import (
	"context"
	crand "crypto/rand"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrClientGone is the cause with which Middleware cancels a request's
// context when the client of the POST that carried it went away before its
// answer (see CancelAbandoned).
var ErrClientGone = errors.New("gosdk: the client went away before its answer")

// postHeader carries the nonce CancelAbandoned gives a POST: Middleware
// finds the POST's context by it. CancelAbandoned sets it on every POST; a
// client that sends it to a server without CancelAbandoned cannot name a
// nonce in posts (each is random and held in this process only).
const postHeader = "Mcpgate-Post"

// posts holds the context of each POST CancelAbandoned is serving, by
// nonce, and for abandonedKept that of a POST whose client went away.
var posts sync.Map // nonce → context.Context

// abandonedKept is how long the context of a POST whose client went away
// is kept for its requests: the SDK queues them, and one may reach
// Middleware after the POST's handler returned.
const abandonedKept = time.Minute

// CancelAbandoned is HTTP middleware for the SDK's Streamable HTTP handler
// next: when the client of a POST goes away (its connection closed) before
// the answer, Middleware cancels the requests the POST carried, with cause
// ErrClientGone, and settles them as enforce.Abandoned, freeing their
// concurrency slots at once, as the gateway does for its upstreams. The
// SDK's stateful handler runs a request on its session's context, not the
// POST's (and so does its stateless handler under MCP 2026-07-28, unless
// PropagateRequestCancellation is set), and would run it to its end, its
// slot held: a client that went away without notifications/cancelled
// would find its retry refused until then. A call the SDK cancelled
// because its POST closed is settled Abandoned too, not Cancelled: the
// client did not ask. An answer written in full (JSON, or an SSE stream that ended) is
// never cancelled: Middleware has returned before it is written.
//
// Do not use it with an EventStore (StreamableHTTPOptions.EventStore),
// whose clients may resume a POST's stream after its connection closed.
func CancelAbandoned(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		nonce := crand.Text()
		r = r.Clone(r.Context()) // a handler must not change the request it was given
		r.Header.Set(postHeader, nonce)
		posts.Store(nonce, r.Context())
		next.ServeHTTP(w, r)
		if r.Context().Err() == nil {
			posts.Delete(nonce)
			return
		}
		time.AfterFunc(abandonedKept, func() { posts.Delete(nonce) })
	})
}

// postContext is the context of the POST that carried req, nil without
// CancelAbandoned.
func postContext(req mcp.Request) context.Context {
	ctx, _ := marked(req, postHeader, &posts)
	post, _ := ctx.(context.Context)
	return post
}

// marked is what nonces holds for the nonce req carries in header: a
// nonce only this process set (a client's own value names nothing).
func marked(req mcp.Request, header string, nonces *sync.Map) (any, bool) {
	if req == nil {
		return nil, false
	}
	extra := req.GetExtra()
	if extra == nil {
		return nil, false
	}
	nonce := extra.Header.Get(header)
	if nonce == "" {
		return nil, false
	}
	return nonces.Load(nonce)
}

// whileConnected is ctx, cancelled with ErrClientGone once the client of
// the POST that carried req went away; post is that POST's context (nil
// without CancelAbandoned), for clientGone; stop ends ctx.
func whileConnected(ctx context.Context, req mcp.Request) (_ context.Context, post context.Context, stop func()) {
	post = postContext(req)
	if post == nil {
		return ctx, nil, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	unwatch := context.AfterFunc(post, func() { cancel(ErrClientGone) })
	return ctx, post, func() {
		unwatch()
		cancel(nil)
	}
}

// clientGone reports whether the client of post (whileConnected's) went
// away.
func clientGone(post context.Context) bool {
	return post != nil && post.Err() != nil
}
