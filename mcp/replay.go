package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// Responses on a stream whose request the proxy does not know.
//
// A client that resumes a stream (GET with Last-Event-ID) gets the events
// the upstream stored for it replayed, the responses to its earlier POSTs
// included. Those POSTs' answers were filtered when first relayed; the
// replayed copies come from the upstream's event store as the upstream
// wrote them, unfiltered. The proxy does not know which request a replayed
// response answers, so it judges the response by its shape: a result with
// a top-level member named like a list Forward.ReplayFilters names is that
// list, and is filtered as the answer to that list method would be.

// replayFilters returns filters with Private set when private, for the
// exchange (the caller's slice is not modified), with room for one more.
// Filters without Allow are left out.
func replayFilters(filters []Filter, private bool) []Filter {
	if len(filters) == 0 {
		return nil
	}
	out := make([]Filter, 0, len(filters)+1)
	for _, f := range filters {
		if f.Allow == nil {
			continue
		}
		f.Private = f.Private || private
		out = append(out, f)
	}
	return out
}

// screenReplay returns what the client gets for ev, a message event that is
// not the answer to the request Serve relays: ev.raw unchanged, the event
// with its list filtered, or nil (nothing: the event was dropped and
// logged). m and perr are Parse's reading of ev.data when the caller already
// has it (both nil otherwise).
func (x *Exchange) screenReplay(ev sseEvent, m *Message, perr error) []byte {
	resp, err := x.screened(ev.data, m, perr)
	switch {
	case err != nil:
		x.p.log.Warn("mcp upstream event dropped: a list on a stream whose request is unknown could not be screened", "err", err)
		return nil
	case resp == nil:
		return ev.raw
	}
	return rewriteEventData(ev.raw, resp)
}

// screened judges data, a message whose request the proxy does not know
// (an event of a resumed stream, the non-SSE answer to a GET), by its
// shape: a response whose result holds a list the replay filters name
// comes back filtered (resp); anything else that cannot hold a result, or
// holds no such list, gives nil (relay data as it is). Data that could
// hold a result but does not parse (a case twin of "result" Parse refuses
// and a client may read) or whose list cannot be filtered is an error:
// never relayed unfiltered. m and perr are Parse's reading of data when the
// caller has it (both nil otherwise); data that cannot hold a result is
// not parsed.
func (x *Exchange) screened(data []byte, m *Message, perr error) (resp []byte, err error) {
	if !mayHoldResult(data) {
		return nil, nil
	}
	if m == nil && perr == nil {
		m, perr = Parse(data)
	}
	if perr != nil {
		return nil, fmt.Errorf("%w: unreadable message could hold a list: %v", ErrBadUpstreamResponse, perr)
	}
	if m.Kind != Response || m.Result == nil {
		return nil, nil
	}
	filtered, changed, err := filterReplayed(m.Result, x.replayList())
	if err != nil || !changed {
		return nil, err
	}
	return resultResponse(m.ID, filtered), nil
}

// filterReplayed applies to result every filter whose list member result
// has at top level (matched ignoring ASCII case, as encoding/json matches
// it; filterList then refuses a member not spelled exactly). changed is
// false when no filter applies.
func filterReplayed(result json.RawMessage, filters []Filter) (_ json.RawMessage, changed bool, _ error) {
	s := jsonscan.New(result)
	if s.Peek() != '{' {
		return result, false, nil // not an object: no list
	}
	var apply []Filter
	err := s.Object(func(key string) error {
		for _, f := range filters {
			if strings.EqualFold(key, f.List.Member) && !hasList(apply, f.List) {
				apply = append(apply, f)
			}
		}
		_, err := s.SkipValue()
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("%w: result: %v", ErrBadUpstreamResponse, err)
	}
	for _, f := range apply {
		if result, err = filterList(result, f); err != nil {
			return nil, false, err
		}
	}
	return result, len(apply) > 0, nil
}

func hasList(filters []Filter, l List) bool {
	for _, f := range filters {
		if f.List == l {
			return true
		}
	}
	return false
}

// mayHoldResult reports whether data could be a JSON-RPC response with a
// result: it has the member name "result" in some letter case, a \u
// escape, which could spell one, or ſ, which encoding/json folds to s
// ("reſult" reads as result).
// It is the cheap test that spares notifications a full parse.
func mayHoldResult(data []byte) bool {
	if bytes.Contains(data, []byte(`\u`)) || bytes.Contains(data, []byte("\u017f")) {
		return true
	}
	const name = "result"
	for i := 0; ; {
		j := bytes.IndexByte(data[i:], '"')
		if j < 0 {
			return false
		}
		i += j + 1
		if len(data)-i > len(name) && data[i+len(name)] == '"' && asciiEqualFold(string(data[i:i+len(name)]), name) {
			return true
		}
	}
}
