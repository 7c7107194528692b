package federate_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// An upstream's URL may carry its credential (a key in its query): when
// the upstream cannot be reached, neither the refusal a client gets nor the
// log shows it.
func TestUnreachableUpstreamURLSecretNotShown(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	var logs testenv.SyncBuffer
	_, url := serve(t, federate.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Upstreams: []federate.Upstream{{Name: "a", URL: a.URL() + "?api_key=SUPERSECRET", Prefix: "a__"}}})
	cs := connect(t, url, newClient("c", nil))
	a.stop()
	got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "hi"})
	if !isErr || !strings.Contains(got, "cannot be reached") {
		t.Fatalf("a__echo with a down: %q (isError %v), want the refusal", got, isErr)
	}
	if strings.Contains(got, "SUPERSECRET") || strings.Contains(logs.String(), "SUPERSECRET") {
		t.Errorf("the upstream's key reached the client or the log:\n%s\n%s", got, logs.String())
	}
}
