package mcp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// An SSE answer is relayed event by event, flushing after each, in two
// legs: Answer relays up to the response to Forward.Msg and holds it;
// Finish writes what is held and relays the rest.

// startStream writes the response headers of an SSE answer, once.
func (x *Exchange) startStream() {
	if x.events != nil {
		return
	}
	x.copyResponseHeaders()
	h := x.w.Header()
	h.Del("Content-Length")
	h.Set("X-Accel-Buffering", "no")
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-cache")
	}
	x.w.WriteHeader(x.resp.StatusCode)
	x.rc = http.NewResponseController(x.w)
	_ = x.rc.Flush() // headers now: a GET stream may stay silent for long
	x.events = newEventReader(x.resp.Body, x.p.maxEvent)
}

// relayEvents relays events until the stream ended, the client went away,
// or an event ends the relay; with untilAnswer, also until the response to
// Forward.Msg arrived, which it holds rather than writes.
func (x *Exchange) relayEvents(untilAnswer bool) {
	for !x.ended && !x.gone {
		ev, err := x.events.next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				x.streamErr = err
			}
			x.ended = true
			x.endStream()
			return
		}
		x.idle.touch()
		x.resumable = x.resumable || ev.hasID
		out, stop := x.eventOut(ev)
		if stop != nil {
			x.held, x.stopErr, x.ended = out, stop, true
			return
		}
		if out == nil {
			continue
		}
		if ev.unterminated {
			out = terminate(out)
		}
		if untilAnswer && x.reported { // this event answered: Answer relays from the first event
			x.held = out
			return
		}
		x.write(out)
	}
}

// write sends out to the client and flushes it; a failure marks it gone.
func (x *Exchange) write(out []byte) {
	if _, err := x.w.Write(out); err != nil {
		x.gone = true
		return
	}
	if err := x.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		x.gone = true
	}
}

// endStream classifies how the stream ended (x.streamErr becomes what
// Finish returns) and, when the call's response never came and the client
// cannot resume the stream, holds an error event answering it, so that the
// client is not left waiting, and makes Finish report the failure even when
// the stream ended cleanly. It runs once, where the stream ends.
func (x *Exchange) endStream() {
	if x.streamErr != nil {
		x.streamErr = x.cause(x.streamErr)
		if errors.Is(x.streamErr, ErrClientGone) || errors.Is(x.streamErr, ErrCancelled) {
			return // no answer: nobody reads it, or MCP forbids it
		}
		if x.f.Msg.IsCall() && x.reported && errors.Is(x.streamErr, ErrUpstreamTimeout) {
			// The call's response was relayed: an upstream that leaves the
			// stream open and silent after it (MCP: it SHOULD close it)
			// cut nothing, and a gateway must not take the call for one
			// still running upstream. The relay ends here, cleanly.
			x.p.log.Debug("mcp upstream left an answered stream open", "rpc_method", x.f.Msg.Method, "err", x.streamErr)
			x.streamErr = nil
			return
		}
		x.p.log.Warn("mcp upstream stream broke", "rpc_method", methodOf(x.f.Msg), "err", x.streamErr)
	}
	// Unless the client can resume the stream (event ids were sent, and it
	// was not our timeout that cut it), answer the call ourselves.
	err := x.streamErr
	if !x.f.Msg.IsCall() || x.reported || (x.resumable && !errors.Is(err, ErrUpstreamTimeout)) {
		return
	}
	msg := "upstream MCP server ended the stream without a response"
	if err != nil {
		_, msg = failureAnswer(err)
	} else {
		// The call got no answer, as from a cut stream: Finish says so (a
		// gateway settles it as failed, not as the tool's error).
		x.streamErr = fmt.Errorf("%w: the stream ended without the response", ErrUpstreamUnavailable)
	}
	x.report(nil, errorObject(CodeInternalError, msg))
	x.held = append(x.held, errorEvent(x.f.Msg.ID, CodeInternalError, msg)...)
}

// finishStream relays an SSE answer to its end.
func (x *Exchange) finishStream() (int, error) {
	status := x.resp.StatusCode
	x.startStream()
	for {
		if len(x.held) > 0 {
			held := x.held
			x.held = nil
			x.write(held)
		}
		switch {
		case x.stopErr != nil:
			return status, x.stopErr
		case x.gone:
			return status, ErrClientGone
		case x.ended:
			return status, x.streamErr
		default:
			x.relayEvents(false)
		}
	}
}

// eventOut returns what the client gets for the upstream event ev: ev.raw,
// a rewritten event, or nil (nothing). A non-nil stop ends the relay after
// out (an error event) is written.
func (x *Exchange) eventOut(ev sseEvent) (out []byte, stop error) {
	if ev.data == nil {
		return ev.raw, nil
	}
	if ev.name != "" && ev.name != "message" {
		// Not a message: MCP clients ignore it. One that could carry a
		// list is screened all the same, for a client that does not.
		if len(x.replayList()) == 0 {
			return ev.raw, nil
		}
		return x.screenReplay(ev, nil, nil), nil
	}
	var m *Message
	var perr error
	switch {
	case x.f.Msg.IsCall() && !x.reported:
		m, perr = Parse(ev.data)
		if perr == nil && m.Kind == Response && SameID(m.ID, x.f.Msg.ID) {
			return x.answer(ev, m)
		}
		x.askedClient(m, perr)
	case x.f.Msg == nil && x.f.AskedClient != nil: // a GET stream
		m, perr = Parse(ev.data)
		x.askedClient(m, perr)
	}
	if len(x.replayList()) == 0 {
		return ev.raw, nil
	}
	return x.screenReplay(ev, m, perr), nil
}

// askedClient calls Forward.AskedClient when m, an event's message, is a
// request to the client (a ping asks for nothing).
func (x *Exchange) askedClient(m *Message, perr error) {
	if perr == nil && m.Kind == Request && m.Method != "ping" && x.f.AskedClient != nil {
		x.f.AskedClient()
	}
}

// replayList returns x.replay, building it the first time an event needs
// it: most exchanges relay no event that is not their own answer. The
// request's own Filter is among them, for a caller that set it alone: a
// list it hides must not come back in another event of the same stream.
func (x *Exchange) replayList() []Filter {
	if !x.replayOK {
		x.replay = replayFilters(x.f.ReplayFilters, x.private)
		if x.f.Filter.Allow != nil && !hasList(x.replay, x.f.Filter.List) {
			x.replay = append(x.replay, x.f.Filter) // Private already set by Start
		}
		x.replayOK = true
	}
	return x.replay
}

// answer returns the event relaying m, the response to f.Msg carried by
// ev: filtered when Forward.Filter applies, and reported for Answer.
func (x *Exchange) answer(ev sseEvent, m *Message) ([]byte, error) {
	out, result := ev.raw, m.Result
	if x.filtering() && result != nil {
		filtered, err := filterList(result, x.f.Filter)
		if err != nil {
			x.p.log.Warn("mcp upstream list result unfilterable", "rpc_method", x.f.Msg.Method, "err", err)
			msg := "upstream MCP server sent an unusable response"
			x.report(nil, errorObject(CodeInternalError, msg))
			return errorEvent(m.ID, CodeInternalError, msg), err
		}
		result = filtered
		out = rewriteEventData(ev.raw, resultResponse(m.ID, filtered))
	}
	x.report(result, m.Error)
	return out, nil
}
