package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/mcpgate/mcpgate/metrics"
)

// How one event's delivery ends for each kind of answer: a 2xx delivers
// it; a 5xx or a 408/425/429 is tried alertAttempts times; any other 4xx is
// final at once, and so is a redirect that would turn the POST into a GET
// (301, 302, 303): never a delivery to the page it points at. A 307 or 308
// repeats the POST at the new location.
func TestAlertDeliveryAnswers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		status    int
		delivered bool
		attempts  int64
	}{
		{"ok", http.StatusNoContent, true, 1},
		{"server error", http.StatusBadGateway, false, alertAttempts},
		{"too many requests", http.StatusTooManyRequests, false, alertAttempts},
		{"not found", http.StatusNotFound, false, 1},
		{"forbidden", http.StatusForbidden, false, 1},
		{"found (POST would become GET)", http.StatusFound, false, 1},
		{"see other", http.StatusSeeOther, false, 1},
		{"temporary redirect (POST repeated)", http.StatusTemporaryRedirect, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var attempts, posted atomic.Int64
			mux := http.NewServeMux()
			mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
				attempts.Add(1)
				if c.status >= 300 && c.status < 400 {
					http.Redirect(w, r, "/elsewhere", c.status)
					return
				}
				w.WriteHeader(c.status)
			})
			mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) {
				if b, _ := io.ReadAll(r.Body); r.Method == http.MethodPost && len(b) > 0 {
					posted.Add(1)
				}
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()
			a := newAlerter(srv.URL+"/hook", slog.New(slog.DiscardHandler), metrics.New())
			a.backoff = 0
			err := a.deliver(context.Background(), BreakerEvent{Event: "breaker_opened", Tenant: "acme"})
			if delivered := err == nil; delivered != c.delivered || attempts.Load() != c.attempts {
				t.Fatalf("delivered %v (err %v) after %d attempts; want delivered %v after %d", delivered, err, attempts.Load(), c.delivered, c.attempts)
			}
			if c.delivered && c.status != http.StatusNoContent && posted.Load() != 1 {
				t.Fatalf("the redirect's target got %d POSTs with the event, want 1", posted.Load())
			}
		})
	}
}
