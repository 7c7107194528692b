package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
)

// HeaderRequestID carries the id that ties an answer to the gateway's log
// lines about it.
const HeaderRequestID = "X-Request-Id"

// maxRequestIDBytes bounds a client's X-Request-Id that is reused.
const maxRequestIDBytes = 128

// requestID returns the id of the request r answered through w, and sets it
// on w's X-Request-Id header. The first call decides it: the client's own
// X-Request-Id when it sent exactly one that is 1 to 128 bytes of printable
// ASCII (so it is safe in a header and a log line), else 16 random bytes in
// hex; later calls for the same w return the same id.
func requestID(w http.ResponseWriter, r *http.Request) string {
	if id := w.Header().Get(HeaderRequestID); id != "" {
		return id
	}
	id := ""
	if v := r.Header.Values(HeaderRequestID); len(v) == 1 && validRequestID(v[0]) {
		id = v[0]
	} else {
		id = newRequestID()
	}
	w.Header().Set(HeaderRequestID, id)
	return id
}

// validRequestID reports whether a client's id is 1 to maxRequestIDBytes
// bytes of printable ASCII (0x21..0x7e and space, not leading or trailing:
// HTTP would strip those and the log would show another id).
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDBytes || id[0] == ' ' || id[len(id)-1] == ' ' {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	return hex.EncodeToString(b[:])
}
