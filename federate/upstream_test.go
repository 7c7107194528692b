package federate

import (
	"net/http"
	"testing"
	"time"
)

// A Retry-After, in seconds or as an HTTP date, never takes an upstream out
// of service for more than maxRetryAfter; a bad or past one means a second.
func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, tc := range []struct {
		name, value string
		want        time.Duration
	}{
		{"seconds", "30", 30 * time.Second},
		{"zero seconds", "0", 0},
		{"seconds at the cap", "3600", time.Hour},
		{"seconds past the cap", "86400", time.Hour},
		{"huge seconds", "999999999", time.Hour},
		{"negative seconds", "-5", time.Second},
		{"date", date(90 * time.Second), 90 * time.Second},
		{"date at the cap", date(time.Hour), time.Hour},
		{"date a day ahead", date(24 * time.Hour), time.Hour},
		{"date years ahead", "Fri, 31 Dec 9999 23:59:59 GMT", time.Hour},
		{"date past", date(-time.Minute), time.Second},
		{"empty", "", time.Second},
		{"garbage", "soon", time.Second},
	} {
		if got := retryAfter(tc.value, now).Sub(now); got != tc.want {
			t.Errorf("%s: retryAfter(%q) = now+%v, want now+%v", tc.name, tc.value, got, tc.want)
		}
	}
}
