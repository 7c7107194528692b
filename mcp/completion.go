package mcp

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
)

// MethodCompletionComplete asks for argument completions of a prompt or of
// a resource template: scoped like the prompt or the template it names.
const MethodCompletionComplete = "completion/complete"

// CompletionRef reads params.ref of a completion/complete request: kind is
// "prompt" (ref/prompt, name is the prompt's) or "resource" (ref/resource,
// name is the URI template). Another ref type, or none, is refused (a 400
// *Error): no scope is checked for it, and an upstream that folds case
// would complete "ref/Prompt" as a prompt. Like Parse, it reads
// members as a strict upstream does: a duplicate or case-insensitive twin
// of ref, type, name or uri is refused (a 400 *Error), since another parser
// could pick the other one and complete for a prompt the gateway did not
// check.
func CompletionRef(m *Message) (kind, name string, err *Error) {
	invalid := func(format string, args ...any) *Error {
		return newError(http.StatusBadRequest, CodeInvalidParams, m.ID, format, args...)
	}
	params, perr := members(m.Params, "ref")
	if perr != "" {
		return "", "", invalid("completion/complete params: %s", perr)
	}
	if params[0] == nil {
		return "", "", invalid("completion/complete needs params.ref")
	}
	ref, perr := members(params[0], "type", "name", "uri")
	if perr != "" {
		return "", "", invalid("completion/complete params.ref: %s", perr)
	}
	typ, _ := decodeString(ref[0])
	switch typ {
	case "ref/prompt":
		if name, ok := decodeString(ref[1]); ok {
			return "prompt", name, nil
		}
		return "", "", invalid("completion/complete params.ref needs a string name")
	case "ref/resource":
		if uri, ok := decodeString(ref[2]); ok {
			return "resource", uri, nil
		}
		return "", "", invalid("completion/complete params.ref needs a string uri")
	}
	return "", "", invalid("completion/complete params.ref.type must be \"ref/prompt\" or \"ref/resource\", not %s", refType(ref[0]))
}

// refType describes the raw params.ref.type v for an error message.
func refType(v json.RawMessage) string {
	if v == nil {
		return "missing"
	}
	if typ, ok := decodeString(v); ok {
		return quoteCapped(typ)
	}
	return "a non-string"
}

// members returns the raw values of the named members of the JSON object
// raw (nil for a missing one), or a problem: raw is not an object, or one
// of them appears twice or with another spelling.
func members(raw json.RawMessage, names ...string) ([]json.RawMessage, string) {
	out := make([]json.RawMessage, len(names))
	if len(raw) == 0 || raw[0] != '{' {
		return nil, "want an object"
	}
	var problem string
	s := jsonscan.New(raw)
	err := s.Object(func(key string) error {
		v, err := s.SkipValue()
		if err != nil {
			return err
		}
		if i, exact := lookupField(names, key); i >= 0 {
			switch {
			case !exact:
				problem = setProblem(problem, "member "+strconv.Quote(key)+" is ambiguous")
			case out[i] != nil:
				problem = setProblem(problem, "duplicate member "+strconv.Quote(key))
			default:
				out[i] = v
			}
		}
		return nil
	})
	if err != nil {
		return nil, err.Error()
	}
	return out, problem
}
