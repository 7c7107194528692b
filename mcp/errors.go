package mcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// JSON-RPC error codes used by mcpgate. The first five are JSON-RPC 2.0's own;
// -32020 is MCP's (2026-07-28 reserves -32020..-32099 for MCP itself);
// -33029 is mcpgate's rate-limit code, chosen outside every reserved range
// (-32768..-32000) so it can never collide with a code the protocol assigns.
const (
	CodeParseError     = -32700 // the body is not valid JSON
	CodeInvalidRequest = -32600 // valid JSON, but not an acceptable JSON-RPC message
	CodeMethodNotFound = -32601 // the method does not exist or is not offered
	CodeInvalidParams  = -32602 // params are missing or malformed (e.g. tools/call without a name)
	CodeInternalError  = -32603 // the gateway or the upstream failed

	// CodeHeaderMismatch means the Mcp-Method or Mcp-Name header disagrees
	// with the body (MCP 2026-07-28).
	CodeHeaderMismatch = -32020

	// CodeRateLimited means a rate limit, quota or loop breaker denied the call.
	CodeRateLimited = -33029
)

// BatchRefusedMessage is the error message of the 400 (CodeInvalidRequest)
// answering a JSON-RPC batch.
const BatchRefusedMessage = "JSON-RPC batches are not supported: MCP 2025-06-18 removed them; send one message per request"

// Sentinels an *Error matches with errors.Is, for the refusals a caller may
// want to tell apart from other malformed requests.
var (
	// ErrBatch means the body was a JSON-RPC batch (a top-level array).
	ErrBatch = errors.New("mcp: JSON-RPC batch")
	// ErrMethodNotExact means a method name was a whitespace, control
	// character or case variant of a name (see Parse).
	ErrMethodNotExact = errors.New("mcp: method name is not exact")
	// ErrBadHeader means an interpreted header was repeated, empty or held
	// a control character (see CheckRequestHeaders).
	ErrBadHeader = errors.New("mcp: ambiguous request header")
	// ErrBodyTooLarge means the request body was, or was declared, over the
	// limit (see ReadBody).
	ErrBodyTooLarge = errors.New("mcp: request body too large")
)

// Error is a JSON-RPC error together with the HTTP status it is sent with.
// Parse, ReadBody, CheckRequestHeaders and CheckHeaders return it; Respond
// writes it.
type Error struct {
	HTTPStatus int             // HTTP status of the response, e.g. 400
	Code       int             // JSON-RPC error code, e.g. CodeInvalidRequest
	Message    string          // human-readable description
	ID         json.RawMessage // id of the offending request when known, else nil (sent as null)
	Data       any             // optional error.data; nil omits it
	// Err is the sentinel (ErrBatch, ...) the error matches with errors.Is,
	// nil when none applies. It is not sent.
	Err error
}

// Error implements the error interface.
func (e *Error) Error() string {
	return fmt.Sprintf("jsonrpc error %d (HTTP %d): %s", e.Code, e.HTTPStatus, e.Message)
}

// Unwrap returns e.Err, so that errors.Is(err, ErrBatch) works.
func (e *Error) Unwrap() error { return e.Err }

// maxQuoted bounds the length of a client's value quoted in an error
// message, quotes and escapes included: enough to recognise the value, not
// enough to amplify a huge one.
const maxQuoted = 64

// quoteCapped quotes s like strconv.Quote in at most maxQuoted bytes,
// cutting s at a rune boundary (escapes can make a byte four, a rune ten)
// and marking a cut with "...".
func quoteCapped(s string) string {
	if len(s) <= maxQuoted {
		if q := strconv.Quote(s); len(q) <= maxQuoted {
			return q
		}
	}
	cut := min(len(s), maxQuoted)
	for {
		for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut--
		}
		if q := strconv.Quote(s[:cut]); len(q) <= maxQuoted || cut == 0 {
			return q + "..."
		}
		cut--
	}
}

// Respond writes e as a JSON-RPC error response (see WriteError).
func (e *Error) Respond(w http.ResponseWriter) {
	WriteError(w, e.HTTPStatus, e.ID, e.Code, e.Message, e.Data)
}

func newError(status, code int, id json.RawMessage, format string, args ...any) *Error {
	return &Error{HTTPStatus: status, Code: code, ID: id, Message: fmt.Sprintf(format, args...)}
}

type wireErrorObject struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

type wireErrorResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   wireErrorObject `json:"error"`
}

// errorResponse encodes a JSON-RPC error response. An id that is not valid
// JSON is sent as null and unencodable data is dropped, so the result is
// always a well-formed message.
func errorResponse(id json.RawMessage, code int, message string, data any) []byte {
	if len(id) == 0 || !jsonscan.Valid(id) {
		id = json.RawMessage("null")
	}
	resp := wireErrorResponse{JSONRPC: "2.0", ID: id, Error: wireErrorObject{Code: code, Message: message, Data: data}}
	b, err := json.Marshal(resp)
	if err != nil {
		resp.Error.Data = nil
		b, _ = json.Marshal(resp)
	}
	return b
}

// errorObject encodes just the error member of a JSON-RPC response, the form
// Exchange.Answer returns.
func errorObject(code int, message string) json.RawMessage {
	b, _ := json.Marshal(wireErrorObject{Code: code, Message: message})
	return b
}

// WriteError writes a JSON-RPC error response with the given HTTP status:
// Content-Type application/json, body
// {"jsonrpc":"2.0","id":ID,"error":{"code":CODE,"message":MSG,"data":DATA}}.
// A nil id is written as null (the request's id was unknown); a nil data is
// omitted. Headers already set on w (rate-limit headers, Retry-After) are
// kept.
func WriteError(w http.ResponseWriter, status int, id json.RawMessage, code int, message string, data any) {
	body := errorResponse(id, code, message, data)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", fmt.Sprint(len(body)))
	h.Del("Content-Encoding")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
