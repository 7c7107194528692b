package mcp

import (
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// knownMethods is every request and notification method of MCP 2025-06-18,
// 2025-11-25 and 2026-07-28, in both directions (the go-sdk's method table,
// plus the 2025-11-25 tasks methods it does not implement). It is the one
// list: read it through KnownMethods and IsKnownMethod.
var knownMethods = []string{
	// requests
	MethodInitialize, "ping",
	MethodToolsList, MethodToolsCall,
	"resources/list", "resources/templates/list", MethodResourcesRead,
	"resources/subscribe", "resources/unsubscribe",
	"prompts/list", MethodPromptsGet,
	"completion/complete", "logging/setLevel",
	"sampling/createMessage", "elicitation/create", "roots/list",
	"tasks/get", "tasks/result", "tasks/list", "tasks/cancel", // 2025-11-25
	"server/discover", MethodSubscriptionsListen, // 2026-07-28
	// notifications
	MethodInitialized, MethodCancelled, "notifications/progress",
	"notifications/message",
	"notifications/resources/list_changed", "notifications/resources/updated",
	"notifications/prompts/list_changed", "notifications/tools/list_changed",
	"notifications/roots/list_changed",
	"notifications/elicitation/complete", "notifications/tasks/status", // 2025-11-25
	"notifications/subscriptions/acknowledged", // 2026-07-28
}

// KnownMethods returns the names of every MCP method package mcp knows:
// the requests and notifications of protocol versions 2025-06-18,
// 2025-11-25 and 2026-07-28, client to server and server to client. The
// slice is a fresh copy the caller may modify.
func KnownMethods() []string { return slices.Clone(knownMethods) }

// IsKnownMethod reports whether name is exactly (byte for byte) one of
// KnownMethods.
func IsKnownMethod(name string) bool { return slices.Contains(knownMethods, name) }

// inexactMethod says why name is not an exact method name, or "" when it
// is. A name is inexact when it is empty (no method is named so, and the
// engine reads an empty method as tools/call), has leading or trailing
// whitespace (Unicode spaces and the BOM, which some runtimes trim),
// contains a control character (C0, DEL or C1: a NUL ends the name in C
// strings), or equals a known method under Unicode case folding without
// being that method.
// Unknown names are otherwise exact: the upstream answers them.
func inexactMethod(name string) string {
	if name == "" {
		return "it is empty"
	}
	trimmed := strings.TrimFunc(name, func(r rune) bool { return unicode.IsSpace(r) || r == '\uFEFF' })
	if trimmed != name {
		return "it has leading or trailing whitespace"
	}
	if strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return "it contains a control character"
	}
	if IsKnownMethod(name) {
		return ""
	}
	for _, k := range knownMethods {
		if strings.EqualFold(name, k) {
			return "method names are case-sensitive (did you mean " + strconv.Quote(k) + "?)"
		}
	}
	return ""
}
