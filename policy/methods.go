package policy

import (
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// MethodToolsCall is the method rules count when they name none.
const MethodToolsCall = "tools/call"

// MethodInitialize opens an MCP session.
const MethodInitialize = "initialize"

// MethodNotifications is the name under which rules count the messages a
// client sends that expect no answer: its notifications (initialized,
// cancelled, progress, roots/list_changed, ...) and its responses to the
// server's requests (sampling, elicitation, roots). They are forwarded
// upstream, so they are governed like requests: by the rules naming
// "notifications" in their methods, else by DefaultNotificationsRule. "*"
// does not select them: they have a budget of their own, so that a tenant
// that spent its requests' budget can still answer the server's requests of
// the calls it has in progress. The first cancellation of one of the
// caller's calls in progress is not counted: it stops work.
const MethodNotifications = "notifications"

// RequestMethods are the JSON-RPC request methods of MCP (2025-06-18,
// 2025-11-25 and 2026-07-28) that a rule's methods may name. A request of
// another method is governed by the rules that name "*" (and by
// DefaultRequestsRule when the tier has none).
var RequestMethods = []string{
	"initialize",
	"ping",
	"tools/list",
	"tools/call",
	"resources/list",
	"resources/templates/list",
	"resources/read",
	"resources/subscribe",
	"resources/unsubscribe",
	"prompts/list",
	"prompts/get",
	"completion/complete",
	"logging/setLevel",
	"tasks/get",
	"tasks/result",
	"tasks/list",
	"tasks/cancel",
	"subscriptions/listen",
}

// The built-in rules of methods a tier's rules do not name. Every method is
// governed: a tenant whose tools/call limits are spent must not be able to
// make the upstream do unbounded work through other methods. A rule of
// the tier that names a method replaces them for that method, whatever
// its name. Parse refuses their names for the rules of the file
// (isBuiltinRuleName): counters are keyed by name, per and algorithm, so a
// rule of the file named like one would share its counter, with other
// settings, for the methods it does not name.
var (
	// DefaultInitializeRule counts initialize per tenant: each one may open
	// an upstream session.
	DefaultInitializeRule = Rule{
		Rule: limit.Rule{Name: "default_initialize", Algorithm: limit.TokenBucket, Limit: 10, Period: time.Minute, Burst: 10},
		Per:  keyspace.PerTenant, Methods: []string{MethodInitialize},
	}
	// DefaultRequestsRule counts every other request method but tools/call
	// per tenant (tools/list, ping, resources/read, prompts/get, ...).
	DefaultRequestsRule = Rule{
		Rule: limit.Rule{Name: "default_requests", Algorithm: limit.TokenBucket, Limit: 600, Period: time.Minute, Burst: 120},
		Per:  keyspace.PerTenant, Methods: []string{AllMethods},
	}
	// DefaultNotificationsRule counts the notifications and responses of
	// clients per tenant (MethodNotifications).
	DefaultNotificationsRule = Rule{
		Rule: limit.Rule{Name: "default_notifications", Algorithm: limit.TokenBucket, Limit: 600, Period: time.Minute, Burst: 120},
		Per:  keyspace.PerTenant, Methods: []string{MethodNotifications},
	}
)

// isBuiltinRuleName reports whether name is the name of a built-in rule.
func isBuiltinRuleName(name string) bool {
	return name == DefaultInitializeRule.Name || name == DefaultRequestsRule.Name || name == DefaultNotificationsRule.Name
}

// defaultRuleFor returns the built-in rule of method (not tools/call).
func defaultRuleFor(method string) Rule {
	switch method {
	case MethodInitialize:
		return DefaultInitializeRule
	case MethodNotifications:
		return DefaultNotificationsRule
	}
	return DefaultRequestsRule
}

// knownMethod reports whether m may be named in a rule's methods.
func knownMethod(m string) bool {
	if m == AllMethods || m == MethodNotifications {
		return true
	}
	for _, k := range RequestMethods {
		if k == m {
			return true
		}
	}
	return false
}
