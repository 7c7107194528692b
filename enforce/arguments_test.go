package enforce_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
)

// Arguments without a canonical form are refused where governing the call
// needs one: a tool that invalidates cache entries, and every tool while
// the loop breaker counts identical calls (else spacing or a spelled-twice
// member would give each repeat of one call a new fingerprint).
func TestCheckArguments(t *testing.T) {
	const tools = `
tools:
  update_product: {invalidates: ["product:{{args.id}}"]}
`
	const breaker = `
breaker:
  identical_calls: {count: 3, within: 1m}
`
	twice := json.RawMessage(`{"id":"42","id":"42"}`)
	for _, c := range []struct {
		name, yaml, tool string
		args             json.RawMessage
		want             error
	}{
		{"canonical, breaker", tools + breaker, "echo", json.RawMessage(`{"id":"42"}`), nil},
		{"spelled twice, no breaker", tools, "echo", twice, nil},
		{"spelled twice, breaker", tools + breaker, "echo", twice, enforce.ErrArgumentsNotCanonical},
		{"spelled twice, invalidating tool", tools, "update_product", twice, cache.ErrInvalidArguments},
		{"invalid JSON, breaker", breaker, "echo", json.RawMessage(`{"id":`), enforce.ErrArgumentsNotCanonical},
		{"absent, breaker", breaker, "echo", nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := engines(t, "memory", 1, c.yaml, "")[0]
			err := e.CheckArguments(c.tool, c.args)
			switch {
			case c.want == nil && err != nil:
				t.Fatalf("CheckArguments = %v, want nil", err)
			case c.want != nil && (!errors.Is(err, c.want) || !errors.Is(err, enforce.ErrArgumentsNotCanonical)):
				t.Fatalf("CheckArguments = %v, want %v (and ErrArgumentsNotCanonical)", err, c.want)
			}
		})
	}
}
