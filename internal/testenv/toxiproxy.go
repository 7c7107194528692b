package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Toxiproxy is a fault-injecting TCP proxy (github.com/Shopify/toxiproxy/v2
// run as a library, in the test's process) in front of one server. Clients
// connect to Addr instead of the server; toxics added with AddToxic then
// delay, throttle, reset or stall their traffic. Its methods are safe for
// concurrent use.
type Toxiproxy struct {
	// Addr is the proxy's listening address, 127.0.0.1:PORT.
	Addr string
	// Upstream is the address of the server behind the proxy.
	Upstream string

	proxy *toxiproxy.Proxy
}

// StartToxiproxy starts a proxy on a free port of 127.0.0.1 forwarding to
// upstream (host:port). It is stopped, its connections closed, when the test
// ends.
func StartToxiproxy(tb testing.TB, upstream string) *Toxiproxy {
	tb.Helper()
	// Some toxics log through zerolog's global logger, at trace level.
	zerolog.SetGlobalLevel(zerolog.WarnLevel)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "testenv", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		tb.Fatalf("testenv: start toxiproxy for %s: %v", upstream, err)
	}
	tb.Cleanup(p.Stop)
	// Listen holds the bound address once started.
	return &Toxiproxy{Addr: p.Listen, Upstream: upstream, proxy: p}
}

// Toxic is one toxic as toxiproxy's API describes it: Type is "latency",
// "bandwidth", "reset_peer", "timeout", "slow_close", "slicer" or
// "limit_data"; Stream "upstream" (client to server) or "downstream" (the
// default); Attributes the type's own (latency: latency and jitter in ms;
// bandwidth: rate in KB/s; reset_peer and timeout: timeout in ms).
type Toxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream,omitempty"`
	Toxicity   float32        `json:"toxicity"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// AddToxic adds t to every connection, present and future; Toxicity 0
// means 1 (every connection). It fails the test when toxiproxy refuses it.
func (p *Toxiproxy) AddToxic(tb testing.TB, t Toxic) {
	tb.Helper()
	if t.Toxicity == 0 {
		t.Toxicity = 1
	}
	b, err := json.Marshal(t)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		tb.Fatalf("testenv: add toxic %s: %v", b, err)
	}
}

// RemoveToxic removes the toxic named name; traffic flows normally again on
// the connections it held (a connection a toxic closed stays closed).
func (p *Toxiproxy) RemoveToxic(tb testing.TB, name string) {
	tb.Helper()
	if err := p.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		tb.Fatalf("testenv: remove toxic %s: %v", name, err)
	}
}

// Disable stops the proxy: it closes every connection through it and stops
// listening, so new connections are refused. Enable starts it again on the
// same address.
func (p *Toxiproxy) Disable() { p.proxy.Stop() }

// Enable starts a disabled proxy again on the same address.
func (p *Toxiproxy) Enable(tb testing.TB) {
	tb.Helper()
	if err := p.proxy.Start(); err != nil {
		tb.Fatalf("testenv: restart toxiproxy on %s: %v", p.Addr, err)
	}
}

// String describes the proxy for logs.
func (p *Toxiproxy) String() string { return fmt.Sprintf("toxiproxy %s -> %s", p.Addr, p.Upstream) }
