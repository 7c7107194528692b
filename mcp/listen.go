package mcp

import (
	"errors"
	"net/http"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// ListenResources returns the resource URIs a subscriptions/listen request
// (MCP 2026-07-28) asks updates of: params.notifications.resourceSubscriptions,
// which replaces resources/subscribe and so must be scoped like it. Like
// CompletionRef, it reads members as a strict upstream does: a duplicate or
// case-insensitive twin of notifications or resourceSubscriptions, or a
// list that is not an array of strings, is refused (a 400 *Error), since
// another parser could read a URI the gateway did not check. A request
// that asks none returns none.
func ListenResources(m *Message) ([]string, *Error) {
	invalid := func(format string, args ...any) *Error {
		return newError(http.StatusBadRequest, CodeInvalidParams, m.ID, format, args...)
	}
	if len(m.Params) == 0 || string(m.Params) == "null" {
		return nil, nil
	}
	params, perr := members(m.Params, "notifications")
	if perr != "" {
		return nil, invalid("subscriptions/listen params: %s", perr)
	}
	if params[0] == nil || string(params[0]) == "null" {
		return nil, nil
	}
	n, perr := members(params[0], "resourceSubscriptions")
	if perr != "" {
		return nil, invalid("subscriptions/listen params.notifications: %s", perr)
	}
	if n[0] == nil || string(n[0]) == "null" {
		return nil, nil
	}
	var uris []string
	s := jsonscan.New(n[0])
	err := s.Array(func() error {
		v, lone, err := s.Str(nil, true)
		if err == nil && lone {
			err = errors.New("a lone surrogate in a URI")
		}
		uris = append(uris, string(v))
		return err
	})
	if err != nil {
		return nil, invalid("subscriptions/listen params.notifications.resourceSubscriptions must be an array of strings: %v", err)
	}
	return uris, nil
}
