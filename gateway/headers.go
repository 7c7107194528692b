package gateway

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}

// setRateHeaders writes X-RateLimit-* and the IETF RateLimit /
// RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-headers) for the
// deciding rule of d.
func setRateHeaders(h http.Header, d limit.Decision, now time.Time) {
	if d.Rule.Name == "" {
		return
	}
	reset := ceilSeconds(d.ResetAfter)
	name := sfString(d.Rule.Name)
	// Keys are written in canonical form directly: Header.Set would
	// canonicalise them again on every call.
	h["X-Ratelimit-Limit"] = []string{strconv.FormatInt(d.Limit, 10)}
	h["X-Ratelimit-Remaining"] = []string{strconv.FormatInt(d.Remaining, 10)}
	h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(now.Add(d.ResetAfter).Add(time.Second-1).Unix(), 10)}
	h["Ratelimit-Policy"] = []string{name + ";q=" + strconv.FormatInt(d.Limit, 10) + ";w=" + strconv.FormatInt(max(1, ceilSeconds(d.Rule.Period)), 10)}
	h["Ratelimit"] = []string{name + ";r=" + strconv.FormatInt(d.Remaining, 10) + ";t=" + strconv.FormatInt(reset, 10)}
}

// sfString quotes s as a Structured Field string (RFC 8941): printable ASCII
// only, with '"' and '\' escaped. Other bytes become '_' (rule names are
// validated by the config loader; this is a last line of defence).
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
