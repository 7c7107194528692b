package faults_test

import (
	"testing"

	"go.uber.org/goleak"
)

// leakCheck makes t fail when goroutines it started outlive it. Call it
// first in the test: its check is the last cleanup to run, after those
// that close the gateways, clients and servers.
func leakCheck(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		goleak.VerifyNone(t,
			// rueidis closes the connections a topology refresh dropped 5s
			// later, from a goroutine of its own; it ends by itself. It is
			// _refresh's second closure in the rueidis of go.mod (v1.0.79,
			// cluster.go:400); the first waits in a WaitGroup.
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func1"),
			// rueidis delays a slot-map refresh after a connection error by
			// up to 1s (lazyRefresh); the sleeping goroutine ends by itself.
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
			// toxiproxy's toxic pipes can stay blocked on a channel send after
			// the proxy stopped (the library's, not the gateway's: they hold
			// no connection of ours).
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
			// A store call to a watched Cluster slot, or a probe, returns at
			// its deadline and leaves the client's call behind, which may be
			// waiting for a connection being dialled to a hung node: it ends
			// by the dial timeout (1s).
			goleak.IgnoreAnyFunction("github.com/mcpgate/mcpgate/limit/redisstore.bounded[...].func1"),
			goleak.IgnoreAnyFunction("github.com/mcpgate/mcpgate/limit/redisstore.(*Store).Ping.func1"),
		)
	})
}
