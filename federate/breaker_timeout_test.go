package federate_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// A caller's calls that time out on an upstream that answers (its tool is
// slow on their arguments) are not failures of the upstream: its breaker
// stays closed and the other calls reach it.
func TestSlowCallsOfALiveUpstreamDoNotOpenItsBreaker(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	f, cs := start(t, federate.Options{Failures: 2, Cooldown: time.Minute,
		Upstreams:    []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}},
		ToolTimeouts: map[string]time.Duration{"a__slow": 300 * time.Millisecond}}, nil)
	for i := range 4 {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__slow", Arguments: map[string]any{"ms": 5000}})
		if err == nil {
			t.Fatalf("slow call %d answered %q (isError %v), want a timeout", i+1, testenv.ToolText(res), res.IsError)
		}
		if !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("slow call %d: err = %v, want a timeout", i+1, err)
		}
	}
	if h := f.Health()[0]; h.State != federate.StateUp || h.Failures != 0 {
		t.Errorf("health of a after 4 slow calls = %+v, want up, no failures", h)
	}
	if got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" || isErr {
		t.Fatalf("a__echo after the slow calls = %q (isError %v)", got, isErr)
	}
}

// hangPOSTs makes an upstream's handler take every POST while hang is set
// and answer none (a hung server), until the request ends or the test does.
func hangPOSTs(t *testing.T, hang *atomic.Bool, onlyPing bool) func(http.Handler) http.Handler {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the Federator's close: registered after it
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && hang.Load() {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				if !onlyPing || strings.Contains(string(body), `"method":"ping"`) {
					select {
					case <-r.Context().Done():
					case <-release:
					}
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	}
}

// An upstream that takes requests and answers none (hung): its calls time
// out, and after Options.Failures of them its breaker opens.
func TestHungUpstreamOpensItsBreaker(t *testing.T) {
	var hang atomic.Bool
	a := startHTTPUpstream(t, "a", hangPOSTs(t, &hang, false))
	f, cs := start(t, federate.Options{Failures: 2, Cooldown: time.Minute,
		Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__", Timeout: 300 * time.Millisecond}}}, nil)
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" {
		t.Fatalf("a__echo = %q", got)
	}
	hang.Store(true)
	for i := range 2 {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "x"}})
		if err == nil || !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("call %d to the hung upstream: err = %v, want a timeout", i+1, err)
		}
	}
	got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "x"})
	if !isErr || !strings.Contains(got, "circuit is open") {
		t.Fatalf("call after 2 timeouts = %q (isError %v), want the open breaker's answer", got, isErr)
	}
	if h := f.Health()[0]; h.State != federate.StateOpen || h.Failures != 2 {
		t.Errorf("health of a = %+v, want open after 2 failures", h)
	}
}

// A timeout counts as the upstream's failure only if the upstream
// answered nothing since the call was sent: here pings go unanswered, so
// a slow call alone counts, and one during which another call was
// answered does not.
func TestTimeoutCountsOnlyIfNothingWasAnsweredSince(t *testing.T) {
	var hang atomic.Bool
	a := startHTTPUpstream(t, "a", hangPOSTs(t, &hang, true))
	f, cs := start(t, federate.Options{Failures: 5, Cooldown: time.Minute,
		Upstreams:    []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}},
		ToolTimeouts: map[string]time.Duration{"a__slow": 2 * time.Second}}, nil)
	hang.Store(true)
	slow := func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__slow", Arguments: map[string]any{"ms": 30000}})
		if err == nil || !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("slow call: err = %v, want a timeout", err)
		}
	}
	slow()
	if h := f.Health()[0]; h.Failures != 1 {
		t.Fatalf("health of a after a timeout, pings unanswered = %+v, want 1 failure", h)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		slow()
	}()
	// The echo is sent once the slow call has reached a; a answers it
	// while the slow call waits.
	for a.calls.get("slow") < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	if got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" || isErr {
		t.Fatalf("a__echo = %q (isError %v)", got, isErr)
	}
	<-done
	if h := f.Health()[0]; h.Failures != 0 {
		t.Errorf("health of a after a timeout during which a answered = %+v, want no failures", h)
	}
}
