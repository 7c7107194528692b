package gateway

// A cached load's result may hold what a client answered the upstream: a
// question (sampling, elicitation, roots) on the call's own answer stream,
// which the load sees (mcp.Forward.AskedClient), or one sent out of band on
// the session's GET stream (a go-sdk upstream answering calls as JSON does
// so), which reaches the client through whichever request holds that
// stream. The session tracker counts, per upstream session, the questions
// relayed on its GET stream and the answers its clients POST, so that a
// load can tell whether its session saw either while it ran.
//
// The count is this instance's: behind a load balancer without sticky
// sessions, a GET stream and a client's answer may reach another instance,
// which this one does not hear of (docs/design.md, "Authorization
// contexts").

// askedClient records that the upstream session upstream asked its client
// something on its GET stream, or that the client POSTed an answer to such
// a question. It is called before the event or the answer is relayed, so
// that a load whose result comes after it sees it.
func (t *sessionTracker) askedClient(upstream string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[upstream]; e != nil {
		e.asks++
	}
}

// askedDuring starts watching the upstream session a load runs in ("" for
// none) and returns the func that reports, once the load is over, whether
// the session's client may have been asked something meanwhile: a question
// or an answer counted by askedClient, or a session this instance does not
// track (the tracker was full, or the session ended), which it cannot tell.
func (t *sessionTracker) askedDuring(upstream string) func() bool {
	if upstream == "" {
		return func() bool { return false } // no session: no stream to ask on
	}
	before, tracked := t.asks(upstream)
	return func() bool {
		after, still := t.asks(upstream)
		return !tracked || !still || after != before
	}
}

// asks returns how many questions and answers askedClient counted for
// upstream, and whether it is tracked.
func (t *sessionTracker) asks(upstream string) (n uint64, tracked bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[upstream]
	if e == nil {
		return 0, false
	}
	return e.asks, true
}
