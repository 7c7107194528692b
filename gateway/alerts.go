package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/metrics"
)

// BreakerEvent is the JSON body POSTed to breaker.alert_webhook when a loop
// breaker opens.
type BreakerEvent struct {
	Event    string        `json:"event"` // "breaker_opened"
	Tenant   string        `json:"tenant"`
	Subject  string        `json:"subject"`
	Key      string        `json:"key"` // the breaker's id, as DELETE /admin/breakers/{key} takes it
	Reason   string        `json:"reason"`
	Counts   BreakerCounts `json:"counts"`
	OpenedAt time.Time     `json:"opened_at"`
	Until    time.Time     `json:"until"`
}

// BreakerCounts are the trigger counters when a breaker opened.
type BreakerCounts struct {
	Denials   int64 `json:"consecutive_denials"`
	Failures  int64 `json:"consecutive_failures"`
	Identical int64 `json:"identical_calls"`
}

// Alert delivery bounds: a full queue drops (and logs) rather than blocks a
// call; each event is tried alertAttempts times with doubling backoff.
const (
	alertQueue    = 1024
	alertAttempts = 4
	alertBackoff  = 250 * time.Millisecond
	alertTimeout  = 5 * time.Second
)

// alerter delivers breaker events to a webhook in the background. The
// webhook's URL can change at any time (setURL, on a reload): each delivery
// attempt posts to the URL in force then, so an event queued before a
// change goes to the new URL, and one still queued when the URL is removed
// is dropped.
type alerter struct {
	url    atomic.Pointer[string] // never nil; "" means no webhook
	client *http.Client
	log    *slog.Logger
	stats  *metrics.Metrics
	queue  chan BreakerEvent
	// backoff is the wait before the second attempt, doubled before each
	// next one (alertBackoff; tests shorten it).
	backoff time.Duration
}

func newAlerter(url string, log *slog.Logger, stats *metrics.Metrics) *alerter {
	client := &http.Client{Timeout: alertTimeout, CheckRedirect: keepPost}
	a := &alerter{client: client, log: log, stats: stats, queue: make(chan BreakerEvent, alertQueue), backoff: alertBackoff}
	a.setURL(url)
	return a
}

// keepPost follows only redirects that repeat the POST (307, 308): after a
// 301, 302 or 303 the client would GET the new location, and its 200 would
// count as the event delivered. The 3xx is then the answer: a refusal.
func keepPost(req *http.Request, via []*http.Request) error {
	if req.Method != http.MethodPost || len(via) >= 10 {
		return http.ErrUseLastResponse
	}
	return nil
}

// errRefused means the webhook refused the event for good (a redirect not
// followed, or a 4xx other than 408, 425 and 429): sending it again would
// get the same answer.
var errRefused = errors.New("the webhook refused the event")

// setURL makes url the webhook of the next deliveries ("" turns alerts
// off). It is safe to call concurrently with send and run.
func (a *alerter) setURL(url string) { a.url.Store(&url) }

// send queues ev without blocking.
func (a *alerter) send(ev BreakerEvent) {
	if *a.url.Load() == "" {
		return
	}
	select {
	case a.queue <- ev:
	default:
		a.stats.AlertsFailed.Inc()
		a.log.Error("breaker alert dropped: the webhook queue is full", "tenant", ev.Tenant, "key", ev.Key)
	}
}

// run delivers queued events until ctx ends.
func (a *alerter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-a.queue:
			if err := a.deliver(ctx, ev); err != nil {
				a.stats.AlertsFailed.Inc()
				a.log.Error("breaker alert not delivered", "tenant", ev.Tenant, "key", ev.Key, "err", err)
			}
		}
	}
}

func (a *alerter) deliver(ctx context.Context, ev BreakerEvent) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	wait := a.backoff
	for attempt := 1; ; attempt++ {
		err = a.post(ctx, body)
		if err == nil || attempt == alertAttempts || errors.Is(err, errRefused) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (a *alerter) post(ctx context.Context, body []byte) error {
	url := *a.url.Load()
	if url == "" {
		return nil // the webhook was removed by a reload since the event was queued
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return redact.URLError(err) // a webhook's token is often its path
	}
	resp.Body.Close()
	switch c := resp.StatusCode; {
	case c < 300:
		return nil
	case c < 400, c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooEarly && c != http.StatusTooManyRequests:
		return fmt.Errorf("%w: it answered %s", errRefused, resp.Status)
	}
	return fmt.Errorf("webhook answered %s", resp.Status)
}
