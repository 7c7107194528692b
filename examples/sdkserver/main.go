// Command sdkserver is an MCP server built with the official Go SDK that
// runs mcpgate's enforcement engine in process (package gosdk): rate
// limits, monthly quotas and metering, the loop breaker and the result
// cache of a normal mcpgate config, with no gateway in front.
//
//	go run ./examples/sdkserver --config FILE --listen ADDR
//
// It serves Streamable HTTP at /mcp with two tools, echo {text} (returns
// the text) and count {} (returns how many tool calls this process has
// served, this one included). Callers authenticate with a bearer JWT
// verified as the config's auth section says (401 otherwise); the tenant,
// tier and subject it names key the limits, and its scopes the tools it
// may see and call. The config is a gateway's without the need for an
// upstream: limits, quotas and breaker apply as in the gateway, on the
// in-process store by default or on store.redis, whose counters it then
// shares with gateways using the same Redis; usage is metered into
// usage.store (an SQLite file gets its schema on first start). SIGINT or
// SIGTERM stops it gracefully: calls in flight finish (and calls whose
// client left are settled when their handler returns), then usage is
// flushed a last time.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "sdkserver:", err)
		os.Exit(1)
	}
}
