package mcp

import "testing"

func TestCompletionRef(t *testing.T) {
	for _, tc := range []struct {
		params, kind, name string
		bad                bool
	}{
		{`{"ref":{"type":"ref/prompt","name":"greet"},"argument":{"name":"a","value":"b"}}`, "prompt", "greet", false},
		{`{"ref":{"type":"ref/resource","uri":"file:///{x}"}}`, "resource", "file:///{x}", false},
		// another ref type is refused: no scope is checked for it, and an
		// upstream that folds case would complete a prompt ("ref/Prompt")
		{`{"ref":{"type":"ref/other"}}`, "", "", true},
		{`{"ref":{"type":"ref/Prompt","name":"a"}}`, "", "", true},
		{`{"ref":{"name":"a"}}`, "", "", true},
		{`{"ref":{"type":1,"name":"a"}}`, "", "", true},
		{`{"ref":{"type":"ref/prompt","name":"a","name":"b"}}`, "", "", true},
		{`{"ref":{"type":"ref/prompt","name":"a","Name":"b"}}`, "", "", true},
		{`{"ref":{"type":"ref/prompt"}}`, "", "", true},
		{`{"Ref":{"type":"ref/prompt","name":"a"}}`, "", "", true},
		{`{}`, "", "", true},
	} {
		m, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":` + tc.params + `}`))
		if err != nil {
			t.Fatalf("%s: %v", tc.params, err)
		}
		kind, name, e := CompletionRef(m)
		if (e != nil) != tc.bad || kind != tc.kind || name != tc.name {
			t.Errorf("%s: %q %q %v", tc.params, kind, name, e)
		}
	}
}
