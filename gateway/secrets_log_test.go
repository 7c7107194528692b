package gateway

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/metrics"
)

// deadAddr is an address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// An upstream URL may carry its credential (an API key in its query): a
// call to an upstream that is down is logged without it.
func TestUpstreamURLSecretNotLogged(t *testing.T) {
	t.Setenv("SECRETS_TEST_UPSTREAM_KEY", "sk-live-SUPERSECRET")
	var logs testenv.SyncBuffer
	e := newEnv(t, setup{UpstreamURL: "http://" + deadAddr(t) + "/mcp?api_key=${SECRETS_TEST_UPSTREAM_KEY}",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	r := post(t, e.mcpURL(0), token(t, "acme", "alice"), methodBody(1, "tools/list", `{}`), nil)
	if r.Status != 502 {
		t.Fatalf("tools/list to a dead upstream: %d %s", r.Status, r.Body)
	}
	testenv.Eventually(t, 10*time.Second, "the failure to be logged", func() bool { return strings.Contains(logs.String(), "upstream") })
	if strings.Contains(logs.String(), "SUPERSECRET") || strings.Contains(string(r.Body), "SUPERSECRET") {
		t.Errorf("the upstream's key reached the log or the answer:\n%s\n%s", logs.String(), r.Body)
	}
}

// A breaker webhook's token is often its path: a failed delivery is
// logged without it.
func TestAlertWebhookURLNotLogged(t *testing.T) {
	var logs testenv.SyncBuffer
	a := newAlerter("http://"+deadAddr(t)+"/services/T000/B000/XXXXSECRETXXXX", slog.New(slog.NewTextHandler(&logs, nil)), metrics.New())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.run(ctx)
	a.send(BreakerEvent{Event: "breaker_opened", Tenant: "acme"})
	testenv.Eventually(t, 20*time.Second, "the failed delivery to be logged", func() bool { return strings.Contains(logs.String(), "not delivered") })
	if strings.Contains(logs.String(), "SECRET") {
		t.Errorf("the webhook's token reached the log:\n%s", logs.String())
	}
}
