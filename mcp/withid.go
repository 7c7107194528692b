package mcp

import (
	"encoding/json"
	"net/http"
	"slices"
)

// WithID returns a copy of body, a request Parse accepts, whose top-level
// id is id (a string or an integer Parse accepts), every other byte as the
// client sent it, and the copy parsed. It is for a request the gateway sends
// upstream on its own behalf (a cache load that outlives the call it was
// made for): the client's id would collide with the client's next request
// that reuses it, or be named by a cancellation meant for the answered
// call. The Message returned is the one to forward with the copy: the proxy
// matches the upstream's answer to its id.
func WithID(body []byte, id json.RawMessage) ([]byte, *Message, error) {
	raw, problem, perr := readEnvelope(body)
	switch {
	case perr != nil:
		return nil, nil, perr
	case problem != "":
		return nil, nil, newError(http.StatusBadRequest, CodeInvalidRequest, nil, "%s", problem)
	case raw[1] == nil:
		return nil, nil, newError(http.StatusBadRequest, CodeInvalidRequest, nil, "not a request: no id to replace")
	}
	// raw[1] is body[start:end] (the scanner returns sub-slices of its
	// input), so its capacity tells where it starts.
	start := cap(body) - cap(raw[1])
	end := start + len(raw[1])
	out := slices.Concat(body[:start], id, body[end:])
	m, err := Parse(out)
	if err != nil {
		return nil, nil, err
	}
	if !m.IsCall() {
		return nil, nil, newError(http.StatusBadRequest, CodeInvalidRequest, m.ID, "not a request")
	}
	return out, m, nil
}
