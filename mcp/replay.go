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
// exchange (the caller's slice is not modified). Filters without Allow are
// left out.
func replayFilters(filters []Filter, private bool) []Filter {
	if len(filters) == 0 {
		return nil
	}
	out := make([]Filter, 0, len(filters))
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
// has it (both nil otherwise). Events that cannot carry a result are
// relayed without being parsed.
func (x *Exchange) screenReplay(ev sseEvent, m *Message, perr error) []byte {
	if !mayHoldResult(ev.data) {
		return ev.raw
	}
	if m == nil && perr == nil {
		m, perr = Parse(ev.data)
	}
	if perr != nil {
		// It may be a response the client reads and Parse refuses (a case
		// twin of "result", say): relayed, it could carry an unfiltered list.
		x.p.log.Warn("mcp upstream event dropped: unreadable message on a stream whose request is unknown", "err", perr)
		return nil
	}
	if m.Kind != Response || m.Result == nil {
		return ev.raw
	}
	filtered, changed, err := filterReplayed(m.Result, x.replay)
	if err != nil {
		x.p.log.Warn("mcp upstream event dropped: list result on a stream whose request is unknown cannot be filtered", "err", err)
		return nil
	}
	if !changed {
		return ev.raw
	}
	return rewriteEventData(ev.raw, resultResponse(m.ID, filtered))
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
