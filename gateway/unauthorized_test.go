package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// logBuffer collects JSON log lines; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records returns the log records whose msg is msg.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(b.buf.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var hexID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// A 401 names no failed check and echoes nothing the caller sent: the body
// says only "missing" or "not accepted" plus a request id, which the
// X-Request-Id header repeats; the reason is logged under that id, without
// the token.
// Not parallel: closing its servers drops http.DefaultTransport's idle
// connections, which breaks POSTs of tests running beside it.
func TestUnauthorizedNamesNoCheck(t *testing.T) {
	logs := &logBuffer{}
	e := newEnv(t, setup{
		Upstream: upstream.Options{Stateless: true},
		Logger:   slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	valid := func() map[string]any { return claims("acme", "alice", "tools:*") }
	forgedKid := strings.Repeat("K", 8<<10)
	cases := []struct {
		name, token, clientID, reason string
		invalid                       bool
	}{
		{"no token", "", "", "no bearer token", false},
		{"expired", sign(t, with(valid(), "exp", time.Now().Add(-time.Hour).Unix())), "client-id-1", "expired", true},
		{"wrong audience", sign(t, with(valid(), "aud", "someone-else")), "", "wrong audience", true},
		{"no exp", sign(t, without(valid(), "exp")), "", "missing claim", true},
		{"forged kid", unsigned(t, map[string]any{"alg": "HS256", "kid": forgedKid}, valid(), "c2ln"), "", "signature", true},
		{"garbage", "not-a-token", "", "not a JWS", true},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		var hdr http.Header
		if c.clientID != "" {
			hdr = http.Header{HeaderRequestID: {c.clientID}}
		}
		r := post(t, e.mcpURL(0), c.token, callBody(1, "echo", map[string]any{"text": "x"}), hdr)
		if r.Status != http.StatusUnauthorized || r.code() != CodeUnauthorized {
			t.Fatalf("%s: %d %s", c.name, r.Status, r.Body)
		}
		want := "unauthorized: the bearer token was not accepted"
		if !c.invalid {
			want = "unauthorized: a bearer token is required"
		}
		if r.Msg.Error.Message != want {
			t.Errorf("%s: message %q, want %q", c.name, r.Msg.Error.Message, want)
		}
		for _, leak := range []string{c.reason, "KKKK", "exp", "aud", "signature", "kid"} {
			if strings.Contains(string(r.Body), leak) {
				t.Errorf("%s: body leaks %q: %s", c.name, leak, r.Body)
			}
		}
		if ch := r.Header.Get("WWW-Authenticate"); !strings.HasPrefix(ch, `Bearer realm="mcpgate"`) || strings.Contains(ch, "invalid_token") != c.invalid {
			t.Errorf("%s: WWW-Authenticate %q", c.name, ch)
		}
		var data unauthorizedData
		if err := json.Unmarshal(r.Msg.Error.Data, &data); err != nil {
			t.Fatalf("%s: data %s: %v", c.name, r.Msg.Error.Data, err)
		}
		id := r.Header.Get(HeaderRequestID)
		switch {
		case data.RequestID != id:
			t.Fatalf("%s: data.request_id %q, header %q", c.name, data.RequestID, id)
		case c.clientID != "" && id != c.clientID:
			t.Fatalf("%s: request id %q, want the client's %q", c.name, id, c.clientID)
		case c.clientID == "" && (!hexID.MatchString(id) || seen[id]):
			t.Fatalf("%s: generated request id %q is not fresh random hex", c.name, id)
		}
		seen[id] = true

		var rec map[string]any
		for _, x := range logs.records(t, "request refused: authentication failed") {
			if x["request_id"] == id {
				rec = x
			}
		}
		wantLevel := "WARN"
		if !c.invalid {
			wantLevel = "INFO"
		}
		switch reason, _ := rec["reason"].(string); {
		case rec == nil:
			t.Fatalf("%s: no log record for request %s:\n%s", c.name, id, logs)
		case rec["level"] != wantLevel:
			t.Errorf("%s: logged at %v, want %s", c.name, rec["level"], wantLevel)
		case !strings.Contains(reason, c.reason):
			t.Errorf("%s: logged reason %q does not say %q", c.name, reason, c.reason)
		case len(reason) > maxLoggedReason:
			t.Errorf("%s: logged reason is %d bytes", c.name, len(reason))
		}
	}
	// No token, nor any of its parts, ever reaches the log.
	out := logs.String()
	for _, c := range cases {
		for part := range strings.SplitSeq(c.token, ".") {
			if len(part) > 8 && strings.Contains(out, part) {
				t.Fatalf("%s: the log holds part of the token:\n%s", c.name, out)
			}
		}
	}
}

func TestRequestIDReuseRules(t *testing.T) {
	cases := map[string]bool{
		"abc":                         true,
		"a b":                         true,
		strings.Repeat("x", 128):      true,
		"":                            false,
		strings.Repeat("x", 129):      false,
		" lead":                       false,
		"trail ":                      false,
		"tab\there":                   false,
		"nl\nhere":                    false,
		"del\x7f":                     false,
		"é":                           false,
		"~!@#$%^&*()_+{}|:<>?[];',./": true,
	}
	for id, want := range cases {
		if got := validRequestID(id); got != want {
			t.Errorf("validRequestID(%q) = %v, want %v", id, got, want)
		}
	}
	// Two X-Request-Id headers: neither is trusted.
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}})
	r := post(t, e.mcpURL(0), "", callBody(1, "echo", nil), http.Header{HeaderRequestID: {"a", "b"}})
	if id := r.Header.Get(HeaderRequestID); !hexID.MatchString(id) {
		t.Fatalf("request id %q with two client ids", id)
	}
}
