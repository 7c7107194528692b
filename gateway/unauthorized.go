package gateway

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/clip"
	"github.com/mcpgate/mcpgate/mcp"
)

// maxLoggedReason bounds the reason logged for a refused token: it may
// quote what the caller sent (a forged kid can run to kilobytes).
const maxLoggedReason = 512

// unauthorizedData is the data member of a 401's JSON-RPC error.
type unauthorizedData struct {
	RequestID string `json:"request_id"`
}

// unauthorized answers a request whose credentials were refused (err from
// auth.Authenticator.FromRequest): 401 with a Bearer challenge and a
// JSON-RPC error that says only whether a token was missing or refused, and
// the request id. Why it was refused goes to the log under that id (Info
// for a missing token, a client's routine first try; Warn for a refused
// one), never to the caller: the reason names the failed check and can echo
// what the caller forged. The token itself is logged nowhere.
func (g *Gateway) unauthorized(w http.ResponseWriter, r *http.Request, err error) {
	g.metrics.Requests.WithLabelValues("any", "unauthorized").Inc()
	id := requestID(w, r)
	// With authorization servers configured, resource_metadata tells the
	// client where to get a token (RFC 9728 §5.1) and scope what to ask
	// for; without them the challenge stays the bare realm.
	challenge := auth.Challenge{Realm: "mcpgate", ResourceMetadata: g.resourceMetadataURL(g.rt.Load(), r)}
	if challenge.ResourceMetadata != "" {
		challenge.Scope = auth.ChallengeScope
	}
	msg, level := "unauthorized: a bearer token is required", slog.LevelInfo
	if !errors.Is(err, auth.ErrNoToken) {
		challenge.Error = "invalid_token"
		msg, level = "unauthorized: the bearer token was not accepted", slog.LevelWarn
	}
	g.log.Log(r.Context(), level, "request refused: authentication failed",
		"request_id", id, "reason", clip.String(err.Error(), maxLoggedReason), "method", r.Method, "remote", r.RemoteAddr)
	w.Header().Set("WWW-Authenticate", challenge.String())
	mcp.WriteError(w, http.StatusUnauthorized, nil, CodeUnauthorized, msg, unauthorizedData{RequestID: id})
}
