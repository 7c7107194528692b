package gateway

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash"
	"net/http"
	"strings"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/mcp"
)

// Event ids are bound to their caller as session ids are (session.go). An
// SSE event id is a handle to a stream: a client resumes the stream after
// it with GET and Last-Event-ID, and an upstream whose event store is
// shared by its sessions (the TypeScript SDK's EventStore.replayEventsAfter
// is given the id alone; a store shared by the instances behind a load
// balancer is the usual way to make resumption work) replays whatever
// stream the id names, whoever asks. So each event id the client sees is
// "<upstream id>.<mac>", the mac covering the caller's tenant and subject,
// the upstream session the stream belongs to ("" when none) and the id; a
// Last-Event-ID that does not verify is refused (400) and nothing is
// forwarded. Binding is stateless, like the session binding: every
// instance sharing the session key accepts the ids of the others.

// eventKeyLabel derives the event-id key from the session key: a mac of one
// kind is never one of the other, whatever their inputs.
const eventKeyLabel = "mcpgate event id binding v1"

// eventIDs binds the event ids of one exchange to its caller and upstream
// session. The keyed hash is made on first use: an exchange whose answers
// carry no event id (JSON answers, streams without ids) never pays for it.
type eventIDs struct {
	binder  *sessionBinder
	p       auth.Principal
	session string // the upstream's session id; "" for none
	mac     hash.Hash
	sum     []byte
}

func (b *sessionBinder) eventIDs(p auth.Principal, session string) eventIDs {
	return eventIDs{binder: b, p: p, session: session}
}

// appendMAC appends the encoded mac of the upstream event id to dst.
func (e *eventIDs) appendMAC(dst, id []byte) []byte {
	if e.mac == nil {
		k := hmac.New(sha256.New, e.binder.key)
		k.Write([]byte(eventKeyLabel))
		e.mac = hmac.New(sha256.New, k.Sum(nil))
	}
	e.mac.Reset()
	var n [8]byte
	for _, f := range [...]string{e.p.Tenant, e.p.Subject, e.session} {
		e.mac.Write(binary.BigEndian.AppendUint64(n[:0], uint64(len(f))))
		e.mac.Write([]byte(f))
	}
	e.mac.Write(binary.BigEndian.AppendUint64(n[:0], uint64(len(id))))
	e.mac.Write(id)
	e.sum = e.mac.Sum(e.sum[:0])
	start := len(dst)
	dst = base64.RawURLEncoding.AppendEncode(dst, e.sum)
	return dst[:start+sessionMACLen]
}

// wrap returns the id the client sees for the upstream's event id.
func (e *eventIDs) wrap(id string) string {
	return string(e.appendMAC(append([]byte(id), '.'), []byte(id)))
}

// unwrap returns the upstream's event id of a client's Last-Event-ID, or
// false when the id was not issued by wrap to this caller in this session
// (forged, another caller's, another session's, or from another key).
func (e *eventIDs) unwrap(client string) (string, bool) {
	i := strings.LastIndexByte(client, '.')
	if i <= 0 || len(client)-i-1 != sessionMACLen {
		return "", false
	}
	id := client[:i]
	mac := e.appendMAC(nil, []byte(id))
	return id, hmac.Equal(mac, []byte(client[i+1:]))
}

// The states of eventIDWriter's reading of the stream's lines.
const (
	lineStart = iota // at the start of a line
	lineMaybe        // held: the start of a line that may be an id line ("i", "id")
	lineID           // held: an id line, until its end
	linePass         // in a line that is not an id line, passed on as it comes
)

// eventIDWriter rewrites the id fields of an event-stream answer as the
// client reads them, wrapping each id (eventIDs.wrap); any other answer,
// and every other line, passes unchanged. It reads the bytes the client
// gets, as an SSE client does (a line ends at CR, LF or CRLF; a field is
// named up to its first colon; one space after it is not part of the
// value), so whatever writes the stream (the proxy, a cache load), every id
// the client can resume from is one the gateway issued. An id line is held
// until it ends; an empty id (a client's reset of its last event id) is
// passed as it is. A stream's BOM is not looked for: the proxy drops the
// upstream's and the gateway writes none.
type eventIDWriter struct {
	http.ResponseWriter
	ids     eventIDs
	decided bool // the answer's headers were read
	stream  bool // the answer is an event stream: ids are rewritten
	line    int  // lineStart...
	held    []byte
	out     []byte // a rewritten id line
}

// Unwrap lets http.NewResponseController reach the server's writer. A
// flush leaves a held line held: the client could not read it before its
// end anyway.
func (w *eventIDWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *eventIDWriter) WriteHeader(code int) {
	if code >= 200 {
		w.decide()
	}
	w.ResponseWriter.WriteHeader(code)
}

// decide reads the answer's headers, once: an event stream has its ids
// rewritten. The answer to a request without a session that opens one (an
// initialize answered on a stream) binds its ids to that session, which
// the client resumes the stream in.
func (w *eventIDWriter) decide() {
	if w.decided {
		return
	}
	w.decided = true
	h := w.Header()
	w.stream = mcp.IsEventStream(h.Get("Content-Type"))
	if !w.stream || w.ids.session != "" {
		return
	}
	if sid := h.Get(mcp.HeaderSessionID); sid != "" {
		if upstream, _, ok := w.ids.binder.unwrap(w.ids.p, sid); ok {
			w.ids.session = upstream
		}
	}
}

func (w *eventIDWriter) Write(b []byte) (int, error) {
	w.decide()
	if !w.stream {
		return w.ResponseWriter.Write(b)
	}
	if err := w.rewrite(b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// rewrite passes b on, its id lines rewritten. Runs of bytes that need no
// rewriting are written as they are, in one piece.
func (w *eventIDWriter) rewrite(b []byte) error {
	from := 0 // b[from:i] is passed on as it is
	i := 0
	for i < len(b) {
		switch w.line {
		case linePass:
			end := lineEnd(b[i:])
			if end < 0 {
				i = len(b)
				continue
			}
			i += end + 1
			w.line = lineStart
		case lineStart:
			n := min(len("id:"), len(b)-i)
			if string(b[i:i+n]) != "id:"[:n] {
				w.line = linePass // an empty line included: its end is at i
				continue
			}
			if err := w.pass(b[from:i]); err != nil {
				return err
			}
			w.held = append(w.held[:0], b[i:i+n]...)
			i += n
			from = i
			w.line = lineMaybe
			if n == len("id:") {
				w.line = lineID
			}
		case lineMaybe:
			if b[i] != "id:"[len(w.held)] {
				// Not an id line after all: what was held is its start.
				if err := w.pass(w.held); err != nil {
					return err
				}
				w.held = w.held[:0]
				w.line = linePass
				continue
			}
			w.held = append(w.held, b[i])
			i++
			from = i
			if len(w.held) == len("id:") {
				w.line = lineID
			}
		case lineID:
			end := lineEnd(b[i:])
			if end < 0 {
				w.held = append(w.held, b[i:]...)
				i = len(b)
				from = i
				continue
			}
			w.held = append(w.held, b[i:i+end+1]...) // its end included
			i += end + 1
			from = i
			if err := w.pass(w.idLine(w.held)); err != nil {
				return err
			}
			w.held = w.held[:0]
			w.line = lineStart
		}
	}
	return w.pass(b[from:])
}

// idLine returns the client's copy of line, an id line with its end: the
// id wrapped, or line itself when the id is empty.
func (w *eventIDWriter) idLine(line []byte) []byte {
	end := line[len(line)-1:]
	value := line[len("id:") : len(line)-1]
	value = bytes.TrimPrefix(value, []byte{' '})
	if len(value) == 0 {
		return line
	}
	w.out = append(append(w.out[:0], "id: "...), value...)
	w.out = w.ids.appendMAC(append(w.out, '.'), value)
	return append(w.out, end...)
}

func (w *eventIDWriter) pass(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := w.ResponseWriter.Write(b)
	return err
}

// lineEnd returns the index of the first CR or LF of b, or -1.
func lineEnd(b []byte) int {
	lf := bytes.IndexByte(b, '\n')
	search := b
	if lf >= 0 {
		search = b[:lf]
	}
	if cr := bytes.IndexByte(search, '\r'); cr >= 0 {
		return cr
	}
	return lf
}

// bindEventIDs refuses a Last-Event-ID not issued to the caller in the
// session it names, giving the upstream its own id otherwise, and readies
// the writer that binds the event ids of the answer (rewriteEventIDs). It
// runs after bindSession, which has put the upstream's session id in the
// request.
//
// A refused id is a 400, the status MCP servers give a Last-Event-ID they
// cannot replay from (the Go SDK's answer to a malformed or unknown one):
// a 404 would say the session is gone, and clients would drop a session
// that is fine. Nothing reaches the upstream.
func (g *Gateway) bindEventIDs(x *exchange) bool {
	x.ids = eventIDWriter{ids: g.sessions.eventIDs(x.p, x.r.Header.Get(mcp.HeaderSessionID))}
	last := x.r.Header.Get(mcp.HeaderLastEventID)
	if last == "" {
		return true
	}
	upstream, ok := x.ids.ids.unwrap(last)
	if !ok {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		mcp.WriteError(x.w, http.StatusBadRequest, nil, mcp.CodeInvalidRequest,
			"Last-Event-ID was not issued to this caller in this session: resume only the streams this session received", nil)
		return false
	}
	x.r.Header.Set(mcp.HeaderLastEventID, upstream)
	return true
}

// rewriteEventIDs puts the writer bindEventIDs readied in front of the
// client's. A GET's is put there before it is forwarded, a POST's once its
// body is read (readBody looks for the server's deadlineWriter in x.w).
func (x *exchange) rewriteEventIDs() {
	x.ids.ResponseWriter = x.w
	x.w = &x.ids
}
