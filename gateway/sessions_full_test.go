package gateway

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/metrics"
)

// A full tracker says so at most once a minute, counting the requests it
// met in between: at the cap every request of every untracked session
// meets it, and a warning each would flood the log.
func TestFullTrackerWarnsOnceAMinute(t *testing.T) {
	var logs testenv.SyncBuffer
	g := &Gateway{log: slog.New(slog.NewTextHandler(&logs, nil)), metrics: metrics.New()}
	tr := newSessionTracker(g, 1)
	now := time.Unix(1_000_000, 0)
	tr.now = func() time.Time { return now }
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	tr.add("kept", p, enforce.SessionSlots{}, "2025-06-18", false)
	for i := range 50 {
		tr.add("untracked-"+string(rune('a'+i%26)), p, enforce.SessionSlots{}, "2025-06-18", false)
	}
	if n := strings.Count(logs.String(), "too many sessions tracked"); n != 1 {
		t.Fatalf("%d warnings for 50 requests within a minute, want 1:\n%s", n, logs.String())
	}
	now = now.Add(time.Minute)
	tr.add("untracked-z", p, enforce.SessionSlots{}, "2025-06-18", false)
	if out := logs.String(); strings.Count(out, "too many sessions tracked") != 2 || !strings.Contains(out, "untracked_requests=50") {
		t.Fatalf("a minute later: want a second warning counting the 49 requests in between and this one:\n%s", out)
	}
}
