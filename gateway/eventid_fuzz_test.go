package gateway

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/mcp"
)

var eventTestKey = []byte("0123456789abcdef0123456789abcdef")

// eventIDsOf is b.eventIDs, addressable.
func eventIDsOf(b *sessionBinder, p auth.Principal, session string) *eventIDs {
	ids := b.eventIDs(p, session)
	return &ids
}

// Hostile Last-Event-ID values: only an id wrap issued to the caller in
// its session unwraps, to exactly the id it wrapped.
func TestEventIDUnwrapRefusesWhatWasNotIssued(t *testing.T) {
	b := newSessionBinder(eventTestKey)
	acme := auth.Principal{Tenant: "acme", Subject: "alice"}
	ids := eventIDsOf(b, acme, "session-1")
	huge := strings.Repeat("x.", 1<<19)
	for _, up := range []string{"s_0", "a.b.c", ".", "..", "x.", "é_1", "流_2", huge, "id with spaces", "\x00", strings.Repeat("A", sessionMACLen)} {
		client := ids.wrap(up)
		if got, ok := ids.unwrap(client); !ok || got != up {
			t.Fatalf("issued %.40q: unwraps to (%.40q, %v)", client, got, ok)
		}
	}
	issued := ids.wrap("s_0")
	mac := issued[len(issued)-sessionMACLen:]
	flipped := []byte(issued)
	flipped[len(flipped)-1] ^= 1
	cases := map[string]string{
		"empty":                  "",
		"no dot":                 "s_0",
		"dot only":               ".",
		"empty id, issued mac":   "." + mac,
		"mac one short":          issued[:len(issued)-1],
		"mac one long":           issued + "A",
		"mac changed":            string(flipped),
		"mac upper-cased":        "s_0." + strings.ToUpper(mac),
		"trailing dot":           issued + ".",
		"another id, same mac":   "s_1." + mac,
		"id extended":            "x.s_0." + mac,
		"non-ASCII mac":          "s_0." + strings.Repeat("é", sessionMACLen/2),
		"huge":                   huge + mac,
		"another session":        eventIDsOf(b, acme, "session-2").wrap("s_0"),
		"no session":             eventIDsOf(b, acme, "").wrap("s_0"),
		"another subject":        eventIDsOf(b, auth.Principal{Tenant: "acme", Subject: "bob"}, "session-1").wrap("s_0"),
		"another tenant":         eventIDsOf(b, auth.Principal{Tenant: "globex", Subject: "alice"}, "session-1").wrap("s_0"),
		"another key":            eventIDsOf(newSessionBinder([]byte("another key")), acme, "session-1").wrap("s_0"),
		"a session id's mac":     b.wrap(acme, "s_0"),
		"a leased session id":    b.wrapLease(acme, "s_0", "lease"),
		"tenant and subject run": eventIDsOf(b, auth.Principal{Tenant: "acmea", Subject: "lice"}, "session-1").wrap("s_0"),
	}
	for name, client := range cases {
		if got, ok := ids.unwrap(client); ok {
			t.Errorf("%s: %.60q unwraps to %.60q", name, client, got)
		}
	}
}

// FuzzEventIDs: an id issued to a caller in a session unwraps there to the
// upstream id, nowhere else; any client string that unwraps is the one
// spelling wrap gives its id.
func FuzzEventIDs(f *testing.F) {
	f.Add("acme", "alice", "s1", "globex", "eve", "s1", "stream_0", "stream_0.AAAAAAAAAAAAAAAAAAAAAA")
	f.Add("a", "b", "", "a", "b", "x", "a.b.", "..")
	f.Add("t", "", "é", "t", "", "é", "\xff", "")
	b := newSessionBinder(eventTestKey)
	f.Fuzz(func(t *testing.T, t1, s1, sess1, t2, s2, sess2, upstream, client string) {
		ids := eventIDsOf(b, auth.Principal{Tenant: t1, Subject: s1}, sess1)
		other := eventIDsOf(b, auth.Principal{Tenant: t2, Subject: s2}, sess2)
		id := ids.wrap(upstream)
		got, ok := ids.unwrap(id)
		if upstream != "" && (!ok || got != upstream) {
			t.Fatalf("issued %q for %q: unwraps to (%q, %v)", id, upstream, got, ok)
		}
		if (t1 != t2 || s1 != s2 || sess1 != sess2) && upstream != "" {
			if got, ok := other.unwrap(id); ok {
				t.Fatalf("id %q unwraps to %q for another caller or session", id, got)
			}
		}
		if cu, ok := ids.unwrap(client); ok && ids.wrap(cu) != client {
			t.Fatalf("client id %q unwraps to %q, issued as %q", client, cu, ids.wrap(cu))
		}
	})
}

// rewrittenStream is what an SSE client must read of stream through the
// gateway: each complete line naming a non-empty id is "id: " and the
// wrapped id, anything else as it is, except a last, unterminated line
// that is or may become an id line (the writer holds it, and a client
// drops an unterminated line anyway).
func rewrittenStream(ids *eventIDs, stream []byte) []byte {
	var out []byte
	for len(stream) > 0 {
		end := bytes.IndexAny(stream, "\r\n")
		if end < 0 {
			if !strings.HasPrefix(string(stream), "id:") && !strings.HasPrefix("id:", string(stream)) {
				out = append(out, stream...)
			}
			break
		}
		n := end + 1
		if stream[end] == '\r' && n < len(stream) && stream[n] == '\n' {
			n++
		}
		line, term := stream[:end], stream[end:n]
		stream = stream[n:]
		if value, ok := bytes.CutPrefix(line, []byte("id:")); ok {
			value = bytes.TrimPrefix(value, []byte{' '})
			if len(value) > 0 {
				out = append(out, "id: "+ids.wrap(string(value))...)
				out = append(out, term...)
				continue
			}
		}
		out = append(out, line...)
		out = append(out, term...)
	}
	return out
}

// FuzzEventIDWriter: however the stream is cut into writes, the client
// gets rewrittenStream's bytes; an answer that is not an event stream
// passes unchanged.
func FuzzEventIDWriter(f *testing.F) {
	f.Add([]byte("id: s_0\ndata: \n\nid: s_1\nevent: message\ndata: {\"id\":1}\n\n"), uint8(3), uint8(7))
	f.Add([]byte("id:a.b\r\n\r\nid\nid:\nid: \nidx: 1\n:id: c\ndata: id: d\n\n"), uint8(1), uint8(2))
	f.Add([]byte("i"), uint8(0), uint8(1))
	f.Add([]byte("i\rid\rid: x\r\nid: é\n\x00id: y\n"), uint8(2), uint8(5))
	f.Add([]byte("retry: 10\nid: "+strings.Repeat("z", 70000)+"\n\n"), uint8(200), uint8(9))
	b := newSessionBinder(eventTestKey)
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	f.Fuzz(func(t *testing.T, stream []byte, cut1, cut2 uint8) {
		ids := eventIDsOf(b, p, "session-1")
		want := rewrittenStream(ids, stream)
		for _, cuts := range [][]int{nil, {int(cut1)}, {int(cut1), int(cut1) + int(cut2)}, everyByte(len(stream))} {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "text/event-stream")
			w := &eventIDWriter{ResponseWriter: rec, ids: b.eventIDs(p, "session-1")}
			w.WriteHeader(http.StatusOK)
			writeCut(t, w, stream, cuts)
			if got := rec.Body.Bytes(); !bytes.Equal(got, want) {
				t.Fatalf("%q written cut at %v: the client read\n%q\nwant\n%q", stream, cuts, got, want)
			}
		}
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", "application/json")
		w := &eventIDWriter{ResponseWriter: rec, ids: b.eventIDs(p, "session-1")}
		writeCut(t, w, stream, []int{int(cut1)})
		if !bytes.Equal(rec.Body.Bytes(), stream) {
			t.Fatalf("a JSON answer was changed: %q became %q", stream, rec.Body.Bytes())
		}
	})
}

// everyByte cuts a stream of n bytes before each byte, up to a bound.
func everyByte(n int) []int {
	cuts := make([]int, 0, min(n, 512))
	for i := 1; i < n && i <= 512; i++ {
		cuts = append(cuts, i)
	}
	return cuts
}

// writeCut writes stream to w in pieces, cut at the (ascending) offsets
// cuts; those out of range are ignored.
func writeCut(t *testing.T, w http.ResponseWriter, stream []byte, cuts []int) {
	t.Helper()
	from := 0
	for _, c := range cuts {
		if c <= from || c >= len(stream) {
			continue
		}
		if _, err := w.Write(stream[from:c]); err != nil {
			t.Fatal(err)
		}
		from = c
	}
	if _, err := w.Write(stream[from:]); err != nil {
		t.Fatal(err)
	}
}

// The event ids of an initialize answered on a stream are bound to the
// session it opens, the one the client resumes that stream in.
func TestEventIDsOfAStreamOpeningASessionAreBoundToIt(t *testing.T) {
	b := newSessionBinder(eventTestKey)
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	rec.Header().Set(mcp.HeaderSessionID, b.wrapLease(p, "session-9", "lease"))
	w := &eventIDWriter{ResponseWriter: rec, ids: b.eventIDs(p, "")}
	if _, err := w.Write([]byte("id: s_0\ndata: \n\n")); err != nil {
		t.Fatal(err)
	}
	client, ok := strings.CutPrefix(strings.SplitN(rec.Body.String(), "\n", 2)[0], "id: ")
	if !ok {
		t.Fatalf("no id in %q", rec.Body.String())
	}
	in := eventIDsOf(b, p, "session-9")
	if up, ok := in.unwrap(client); !ok || up != "s_0" {
		t.Fatalf("id %q in the session it opened: unwraps to (%q, %v)", client, up, ok)
	}
}
