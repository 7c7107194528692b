// Package mcp is mcpgate's view of the Model Context Protocol wire format:
// it parses the JSON-RPC 2.0 envelope of one message (Parse), canonicalises
// tool arguments for cache and loop-breaker keys (CanonicalArguments),
// refuses ambiguous request headers (CheckRequestHeaders), validates the
// MCP 2026-07-28 routing headers (CheckHeaders) and relays Streamable HTTP
// exchanges to an upstream MCP server (Proxy), streaming server-sent events
// one by one.
//
// The gateway reads only the envelope it needs (method, id, params.name,
// the raw params.arguments) and forwards the client's bytes unchanged, so
// the upstream sees exactly what the client sent. The parser is strict where
// a lenient one would let a client show the gateway one thing and the
// upstream another: member names are matched exactly, and a duplicate or
// case-folded twin of a member the gateway reads makes the message invalid;
// method names are exact; the body is one JSON value and nothing after it;
// and every header the gateway interprets appears once, not empty.
package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// Kind classifies a JSON-RPC message.
type Kind int

// The kinds of JSON-RPC message. The zero Kind is invalid; Parse never
// returns it.
const (
	Request      Kind = iota + 1 // has a method and an id; expects a response
	Notification                 // has a method and no id
	Response                     // has an id and a result or an error
)

// String returns "request", "notification" or "response".
func (k Kind) String() string {
	switch k {
	case Request:
		return "request"
	case Notification:
		return "notification"
	case Response:
		return "response"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Method names the gateway treats specially.
const (
	MethodInitialize    = "initialize"
	MethodToolsList     = "tools/list"
	MethodToolsCall     = "tools/call"
	MethodPromptsGet    = "prompts/get"
	MethodResourcesRead = "resources/read"
	// Subscriptions name a resource like resources/read: they are scoped
	// like it.
	MethodResourcesSubscribe   = "resources/subscribe"
	MethodResourcesUnsubscribe = "resources/unsubscribe"
	// MethodInitialized is the notification that ends a session's
	// initialization; clients open their GET stream when it is answered.
	MethodInitialized = "notifications/initialized"
	// MethodCancelled ends a request of the sender's: params.requestId.
	MethodCancelled = "notifications/cancelled"
	// The list methods whose answers a Filter can trim.
	MethodResourcesList         = "resources/list"
	MethodResourceTemplatesList = "resources/templates/list"
	MethodPromptsList           = "prompts/list"
	// MethodSubscriptionsListen (MCP 2026-07-28) opens a long-lived stream of
	// server notifications, the stateless replacement of the GET stream.
	MethodSubscriptionsListen = "subscriptions/listen"
)

// Message is the envelope of one JSON-RPC 2.0 message. Its raw fields are
// sub-slices of the body given to Parse (no copy): the body must not be
// modified while the Message is in use.
type Message struct {
	// ID is the raw id (a string or an integer), nil for notifications. A
	// response to a request that could not be parsed may carry null.
	ID json.RawMessage
	// Method is the method of a request or notification, "" for responses.
	Method string
	// ToolName is params.name of a tools/call request, else "".
	ToolName string
	// Arguments is the raw params.arguments of a tools/call (an object or
	// null), nil when absent. It is validated as JSON but not decoded.
	Arguments json.RawMessage
	// Kind says whether this is a request, a notification or a response.
	Kind Kind

	// CancelID is params.requestId of notifications/cancelled, nil when
	// absent: the request the notification ends.
	CancelID json.RawMessage

	// Name is the value the Mcp-Name header must carry under MCP 2026-07-28:
	// params.name of tools/call and prompts/get, params.uri of
	// resources/read (and of resources/subscribe and unsubscribe, for
	// scopes), else "".
	Name string
	// Params is the raw params member, nil when absent.
	Params json.RawMessage
	// Result and Error are the raw result or error member of a response.
	Result json.RawMessage
	Error  json.RawMessage
}

// IsCall reports whether m is a request (it has an id and expects a
// response).
func (m *Message) IsCall() bool { return m != nil && m.Kind == Request }

// MarshalJSON encodes m as a JSON-RPC 2.0 message from its envelope fields
// (members Parse ignored are not reproduced).
func (m *Message) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"jsonrpc":"2.0"`)
	if m.ID != nil {
		b.WriteString(`,"id":`)
		b.Write(m.ID)
	}
	if m.Kind != Response {
		b.WriteString(`,"method":`)
		b.Write(jsonscan.AppendString(nil, m.Method))
		if m.Params != nil {
			b.WriteString(`,"params":`)
			b.Write(m.Params)
		}
	} else if m.Error != nil {
		b.WriteString(`,"error":`)
		b.Write(m.Error)
	} else {
		b.WriteString(`,"result":`)
		b.Write(m.Result)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// maxSafeID bounds numeric ids to integers a float64 holds exactly: the SDKs
// decode ids through float64, so a larger id would come back as another
// number and the response could not be matched to its request.
const maxSafeID = 1<<53 - 1

// envelopeFields are the top-level members Parse reads.
var envelopeFields = []string{"jsonrpc", "id", "method", "params", "result", "error"}

// Parse parses exactly one JSON-RPC 2.0 message. On failure the error is an
// *Error with HTTP status 400 and code CodeParseError (not JSON),
// CodeInvalidRequest (not a valid message) or CodeInvalidParams (tools/call
// without a string params.name, or with non-object arguments), carrying the
// message's id when it could be read.
//
// Batches (a top-level array) are refused whatever protocol version was
// negotiated, 2025-03-26 included: 400, CodeInvalidRequest, message
// BatchRefusedMessage, matching ErrBatch. The gateway admits, limits and
// meters one call per request; a batch would need all of that per element.
//
// The body must be one JSON value followed by nothing but JSON whitespace:
// trailing bytes, a NUL byte included, are a parse error, since a parser
// that reads on would see a second message.
//
// A method name must be exact (ErrMethodNotExact, CodeInvalidRequest): one
// with leading or trailing whitespace or a control character anywhere, or
// one equal to a KnownMethods name under case folding but not byte for byte
// ("Tools/call", "TOOLS/LIST"), is refused. The gateway governs methods by
// exact name, so such a variant would pass ungoverned to an upstream that
// trims, folds or stops at a NUL.
//
// Rules beyond plain JSON validity: "jsonrpc" must be "2.0"; an id must be a
// string or an integer within ±(2^53-1) (null only in an error response);
// "method" must be a string; a request or notification carries no result or
// error, and a response carries exactly one of them; params, when present,
// is an object or an array; strings are valid UTF-8; nesting is at most
// MaxDepth. A member Parse reads (jsonrpc, id, method, params, result, error;
// and params.name, params.arguments, params.uri) must appear once and spelled
// exactly: a duplicate or a case-insensitive twin ("Method", "NAME") is
// refused, since other parsers would pick a different one. Other members are
// validated and ignored.
func Parse(body []byte) (*Message, error) {
	raw, problem, perr := readEnvelope(body)
	if perr != nil {
		return nil, perr
	}
	version, id, method := raw[0], raw[1], raw[2]
	m := &Message{Params: raw[3], Result: raw[4], Error: raw[5]}
	// The id first, so that every later error can carry it.
	if id != nil {
		if ok, isNull := checkID(id); !ok && !isNull {
			return nil, m.invalid("id must be a string or an integer within ±(2^53-1)")
		}
		m.ID = id // null: only acceptable in an error response, checked below
	}
	if problem != "" {
		return nil, m.invalid("%s", problem)
	}
	if v, ok := decodeString(version); !ok || v != "2.0" {
		return nil, m.invalid(`"jsonrpc" must be "2.0"`)
	}
	var e *Error
	if method != nil {
		e = m.finishRequest(method)
	} else {
		e = m.finishResponse()
	}
	if e != nil {
		return nil, e
	}
	return m, nil
}

// readEnvelope checks that body is one JSON object and nothing else, and
// returns its envelope members (indexed like envelopeFields) and the first
// problem with their names (a duplicate or a case twin), "" if none. A body
// that is not an object, a batch included, is an *Error.
func readEnvelope(body []byte) (raw [6]json.RawMessage, problem string, _ *Error) {
	s := jsonscan.New(body)
	switch first := s.Peek(); first {
	case jsonscan.EOF:
		return raw, "", newError(http.StatusBadRequest, CodeParseError, nil, "empty body")
	case '{':
	default:
		_, err := s.SkipValue()
		if err == nil {
			err = s.End()
		}
		switch {
		case err != nil:
			return raw, "", newError(http.StatusBadRequest, CodeParseError, nil, "parse error: %v", err)
		case first == '[':
			e := newError(http.StatusBadRequest, CodeInvalidRequest, nil, "%s", BatchRefusedMessage)
			e.Err = ErrBatch
			return raw, "", e
		default:
			return raw, "", newError(http.StatusBadRequest, CodeInvalidRequest, nil, "a JSON-RPC message must be an object")
		}
	}
	err := s.Object(func(key string) error {
		v, err := s.SkipValue()
		if err != nil {
			return err
		}
		if i, exact := lookupField(envelopeFields, key); i >= 0 {
			switch {
			case !exact:
				problem = setProblem(problem, "member "+strconv.Quote(key)+" is ambiguous: did you mean "+strconv.Quote(envelopeFields[i])+"?")
			case raw[i] != nil:
				problem = setProblem(problem, "duplicate member "+strconv.Quote(key))
			default:
				raw[i] = v
			}
		}
		return nil
	})
	if err == nil {
		err = s.End()
	}
	if err != nil {
		return raw, "", newError(http.StatusBadRequest, CodeParseError, nil, "parse error: %v", err)
	}
	return raw, problem, nil
}

// invalid is a 400 CodeInvalidRequest error carrying m's id.
func (m *Message) invalid(format string, args ...any) *Error {
	return newError(http.StatusBadRequest, CodeInvalidRequest, m.ID, format, args...)
}

// finishRequest completes a request or notification whose raw method member
// is method, m.ID and the raw members being set.
func (m *Message) finishRequest(method json.RawMessage) *Error {
	name, ok := decodeString(method)
	if !ok {
		return m.invalid(`"method" must be a string`)
	}
	m.Method = name
	if why := inexactMethod(name); why != "" {
		e := m.invalid("method name %s is not exact: %s", quoteCapped(name), why)
		e.Err = ErrMethodNotExact
		return e
	}
	if m.Result != nil || m.Error != nil {
		return m.invalid("a request must not carry a result or an error")
	}
	switch {
	case string(m.ID) == "null":
		return m.invalid("a request id must not be null")
	case m.ID != nil:
		m.Kind = Request
	default:
		m.Kind = Notification
		if IsKnownMethod(name) && !strings.HasPrefix(name, "notifications/") {
			// A request method without an id: no upstream runs it, and
			// the gateway would govern (and bill) it as the request.
			return m.invalid("%s is a request: it needs an id", name)
		}
	}
	if m.Params != nil && m.Params[0] != '{' && m.Params[0] != '[' {
		return m.invalid(`"params" must be an object or an array`)
	}
	return m.parseParams()
}

// finishResponse completes a message without a method: a response.
func (m *Message) finishResponse() *Error {
	switch {
	case m.ID == nil:
		return m.invalid(`a message needs a "method" or an "id"`)
	case m.Params != nil:
		return m.invalid("a response must not carry params")
	case (m.Result == nil) == (m.Error == nil):
		return m.invalid("a response carries exactly one of result and error")
	case m.Error != nil && m.Error[0] != '{':
		return m.invalid(`"error" must be an object`)
	case string(m.ID) == "null" && m.Error == nil:
		return m.invalid("only an error response may have a null id")
	}
	m.Kind = Response
	return nil
}

// parseParams reads the params members the gateway needs: the tool name and
// arguments of tools/call (refusing a task-augmented one), the name of
// prompts/get, the uri of resources/read, resources/subscribe and
// resources/unsubscribe.
func (m *Message) parseParams() *Error {
	invalid := func(format string, args ...any) *Error {
		return newError(http.StatusBadRequest, CodeInvalidParams, m.ID, format, args...)
	}
	var nameField string
	switch m.Method {
	case MethodToolsCall, MethodPromptsGet:
		nameField = "name"
	case MethodResourcesRead, MethodResourcesSubscribe, MethodResourcesUnsubscribe:
		nameField = "uri"
	case MethodCancelled:
		// The gateway ends the call it names and forwards the message: the
		// upstream must read the same request id, so a duplicate or a case
		// twin ("RequestId") is refused like one in a tools/call.
		if m.Params == nil || m.Params[0] != '{' {
			return nil // nothing to cancel; forwarded as it is
		}
		raw, problem := members(m.Params, "requestId")
		if problem != "" {
			return invalid("params: %s", problem)
		}
		// The id must be one the upstream reads as the gateway does: a
		// string or a safe integer (an SDK truncating 7.5 to 7 would cancel
		// a call the gateway matched to none).
		if id := raw[0]; id != nil {
			if ok, _ := checkID(id); !ok {
				return invalid("params.requestId must be a string or an integer within ±(2^53-1)")
			}
		}
		m.CancelID = raw[0]
		return nil
	default:
		return nil
	}
	if m.Params == nil || m.Params[0] != '{' {
		return invalid("%s needs params with a %q", m.Method, nameField)
	}
	raw, problem := members(m.Params, nameField, "arguments", "task")
	if problem != "" {
		return invalid("params: %s", problem)
	}
	name, ok := decodeString(raw[0])
	if !ok {
		return invalid("%s needs a string params.%s", m.Method, nameField)
	}
	m.Name = name
	if m.Method != MethodToolsCall {
		return nil
	}
	if name == "" {
		return invalid("tools/call needs a non-empty params.name")
	}
	m.ToolName = name
	if task := raw[2]; task != nil && string(task) != "null" {
		// MCP 2025-11-25 task-augmented calls answer at once with a task
		// handle and deliver the result through tasks/result: the call's
		// concurrency slot, cost correction and outcome could not be
		// governed, so they are refused rather than let through unmetered.
		return invalid("task-augmented tools/call is not supported through mcpgate: call the tool without params.task")
	}
	if args := raw[1]; args != nil {
		if args[0] != '{' && string(args) != "null" {
			return invalid("params.arguments must be an object")
		}
		m.Arguments = args
	}
	return nil
}

// lookupField returns the index of the field key names, matching exactly or,
// failing that, case-insensitively with Unicode folding (the way
// encoding/json matches struct fields); exact reports which. It returns -1
// when key is unrelated to every field.
func lookupField(fields []string, key string) (i int, exact bool) {
	for i, f := range fields {
		if key == f {
			return i, true
		}
	}
	for i, f := range fields {
		if strings.EqualFold(key, f) {
			return i, false
		}
	}
	return -1, false
}

func setProblem(old, p string) string {
	if old != "" {
		return old
	}
	return p
}

// decodeString decodes a raw JSON value that must be a string free of lone
// surrogates (which no other parser would decode the same way).
func decodeString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	s := jsonscan.New(raw)
	v, lone, err := s.Str(nil, true)
	if err != nil || lone {
		return "", false
	}
	return string(v), true
}

// checkID reports whether raw is an acceptable id (a string, or an integer
// of magnitude at most maxSafeID written without fraction or exponent
// beyond what keeps it an integer), or null.
func checkID(raw json.RawMessage) (ok, isNull bool) {
	switch c := raw[0]; {
	case c == 'n':
		return false, true
	case c == '"':
		_, ok := decodeString(raw)
		return ok, false
	case c == '-' || (c >= '0' && c <= '9'):
		_, ok := idNumber(raw)
		return ok, false
	}
	return false, false
}

// idNumber returns the integer value of a numeric id, if it is one.
func idNumber(raw json.RawMessage) (int64, bool) {
	s := jsonscan.New(raw)
	if lit, err := s.Number(); err != nil || len(lit) != len(raw) {
		return 0, false
	}
	canon, err := jsonscan.AppendNumber(nil, raw)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(string(canon), 10, 64)
	if err != nil || n > maxSafeID || n < -maxSafeID {
		return 0, false
	}
	return n, true
}

// SameID reports whether two raw ids denote the same id: equal strings after
// unescaping, or equal integers however written (1, 1.0, 1e0).
func SameID(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	if a[0] == '"' && b[0] == '"' {
		x, ok1 := decodeString(a)
		y, ok2 := decodeString(b)
		return ok1 && ok2 && x == y
	}
	x, ok1 := idNumber(a)
	y, ok2 := idNumber(b)
	return ok1 && ok2 && x == y
}

// DefaultMaxBody is the body limit ReadBody applies when given max <= 0; it
// matches the Go SDK's default request limit.
const DefaultMaxBody = 4 << 20

// initialBodyBuffer is the most ReadBody allocates before any byte has
// arrived. A declared Content-Length is a promise, not data: sizing the
// buffer to it let idle connections each pin DefaultMaxBody of memory.
const initialBodyBuffer = 16 << 10

// ReadBody reads the whole request body, refusing more than max bytes
// (DefaultMaxBody when max <= 0) with a 413 *Error (code CodeInvalidRequest,
// matching ErrBodyTooLarge): a declared Content-Length over the limit is
// refused without reading, and a body that turns out longer is refused once
// max+1 bytes have arrived. A failed read is a 400 *Error (code
// CodeParseError). A request without a body gives nil and no error.
//
// Memory follows the bytes received, never the bytes declared: the buffer
// starts at min(Content-Length+1, 16 KiB) and doubles as it fills, so a
// client declaring 4 MiB and sending one byte costs about 16 KiB.
func ReadBody(r *http.Request, max int64) ([]byte, *Error) {
	if max <= 0 {
		max = DefaultMaxBody
	}
	tooLarge := func() *Error {
		e := newError(http.StatusRequestEntityTooLarge, CodeInvalidRequest, nil, "request body exceeds %d bytes", max)
		e.Err = ErrBodyTooLarge
		return e
	}
	if r.ContentLength > max {
		return nil, tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := readGrowing(r.Body, r.ContentLength, max)
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errOverLimit), errors.As(err, &mbe):
		return nil, tooLarge()
	case err != nil:
		return nil, newError(http.StatusBadRequest, CodeParseError, nil, "reading request body: %v", err)
	}
	return body, nil
}

// plusOne is x+1, or x at math.MaxInt64 (a length no body reaches), where
// x+1 would wrap to a negative size.
func plusOne(x int64) int64 {
	if x == math.MaxInt64 {
		return x
	}
	return x + 1
}

// errOverLimit means readGrowing received more than its limit.
var errOverLimit = errors.New("body over the limit")

// readGrowing reads rd to EOF, refusing (errOverLimit, with the max+1
// bytes read) more than max bytes.
// The buffer grows with the data: it starts at initialBodyBuffer (or
// declared+1 when smaller, declared < 0 meaning unknown) and doubles only
// when full; a doubling that reaches the declared length stops at declared+1
// (the extra byte lets the final read see EOF without growing again), and
// none goes past max+1 (one byte past the limit proves the body too long).
func readGrowing(rd io.Reader, declared, max int64) ([]byte, error) {
	limit := plusOne(max)
	size := min(int64(initialBodyBuffer), limit)
	if declared >= 0 {
		size = min(size, plusOne(declared))
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) { // then len(buf) < limit: more would have been refused
			c := int64(cap(buf))
			next := 2 * c
			if declared >= 0 && c <= declared && next >= declared {
				next = plusOne(declared)
			}
			next = min(next, limit)
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case int64(len(buf)) > max:
			return buf, errOverLimit
		case err == io.EOF:
			return buf, nil
		case err != nil:
			return nil, err
		}
	}
}

// MaxDepth is the deepest nesting of objects and arrays Parse accepts.
const MaxDepth = jsonscan.MaxDepth

// Errors of CanonicalArguments, from package jsonscan.
var (
	// ErrDuplicateKey means a JSON object has the same member name twice
	// (after unescaping): parsers disagree on which member wins, so it has
	// no single meaning and no canonical form.
	ErrDuplicateKey = jsonscan.ErrDuplicateKey
	// ErrNumberRange means a number's exponent is too large to normalise.
	ErrNumberRange = jsonscan.ErrNumberRange
	// ErrLoneSurrogateKey means a member name holds an escaped lone
	// surrogate: parsers disagree on what it names, so it has no
	// canonical form.
	ErrLoneSurrogateKey = jsonscan.ErrLoneSurrogateKey
)

// CanonicalArguments returns the canonical JSON form of a tools/call
// arguments value, the form the result cache and the loop breaker key on
// (see jsonscan.Canonical).
func CanonicalArguments(raw json.RawMessage) ([]byte, error) { return jsonscan.Canonical(raw) }
