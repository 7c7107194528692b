package jsonscan

import (
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	tests := []struct{ in, want string }{
		{``, `{}`},
		{`null`, `{}`},
		{` {} `, `{}`},
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"{ \"a\" : [ 1 , 2 ] ,\n \"b\" : { \"d\" : true , \"c\" : null } }", `{"a":[1,2],"b":{"c":null,"d":true}}`},
		{`{"n":1.0}`, `{"n":1}`},
		{`{"n":1e0}`, `{"n":1}`},
		{`{"n":10e-1}`, `{"n":1}`},
		{`{"n":0.1e1}`, `{"n":1}`},
		{`{"n":100E-2}`, `{"n":1}`},
		{`{"n":-0}`, `{"n":-0}`},
		{`{"n":-0.0}`, `{"n":-0}`},
		{`{"n":-0e3}`, `{"n":-0}`},
		{`{"n":-0.0e5}`, `{"n":-0}`},
		{`{"n":-0.000E-7}`, `{"n":-0}`},
		{`{"n":0.0e5}`, `{"n":0}`},
		{`{"n":0E-3}`, `{"n":0}`},
		{`{"n":1e2}`, `{"n":100}`},
		{`{"n":0.5}`, `{"n":5e-1}`},
		{`{"n":1.50}`, `{"n":1.5e0}`},
		{`{"n":-12.5e1}`, `{"n":-125}`},
		{`{"n":1e21}`, `{"n":1e21}`},
		{`{"n":100000000000000000000}`, `{"n":100000000000000000000}`},
		{`{"n":12345678901234567890123}`, `{"n":1.2345678901234567890123e22}`},
		{`{"s":"\u0041\/\t\u001f\"\\é\u00e9<>&"}`, `{"s":"A/\t\u001f\"\\éé<>&"}`},
		{`{"s":"\ud83d\ude00"}`, `{"s":"😀"}`},
		{`{"s":"\ud83d"}`, `{"s":"\ud83d"}`},
		{`{"s":"\uDBFFx"}`, `{"s":"\udbffx"}`},
		{`{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{`{"\ud83d\ude00":1,"\ufffd":2}`, "{\"\ufffd\":2,\"😀\":1}"},
		{`[3,{"z":1,"y":2}]`, `[3,{"y":2,"z":1}]`},
		{`"x"`, `"x"`},
	}
	for _, tt := range tests {
		got, err := Canonical(json.RawMessage(tt.in))
		if err != nil {
			t.Errorf("Canonical(%s): %v", tt.in, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Canonical(%s) = %s, want %s", tt.in, got, tt.want)
		}
		if !json.Valid(got) {
			t.Errorf("Canonical(%s) = %s is not valid JSON", tt.in, got)
		}
	}
}

func TestCanonicalArgumentsDistinct(t *testing.T) {
	// Values that differ must keep differing.
	pairs := [][2]string{
		{`{"n":1}`, `{"n":"1"}`},
		{`{"n":12345678901234567890}`, `{"n":12345678901234567891}`},
		{`{"n":0.1}`, `{"n":0.10000000000000001}`},
		{`{"s":"\ud800"}`, `{"s":"\udbff"}`},
		{`{"s":"\ud800"}`, `{"s":"\ufffd"}`},
		{`{"a":[1,2]}`, `{"a":[2,1]}`},
		{`{"a":null}`, `{}`},
		{`{"A":1}`, `{"a":1}`},
		{`{"x":-0.0}`, `{"x":0}`}, // distinct float64s: 1/x differs
		{`[-0]`, `[0.0]`},
	}
	for _, p := range pairs {
		a, err1 := Canonical(json.RawMessage(p[0]))
		b, err2 := Canonical(json.RawMessage(p[1]))
		if err1 != nil || err2 != nil {
			t.Fatalf("%v %v", err1, err2)
		}
		if string(a) == string(b) {
			t.Errorf("%s and %s both canonicalise to %s", p[0], p[1], a)
		}
	}
}

// TestCanonicalLoneSurrogateKey: a Go upstream decodes every escaped lone
// surrogate in a member name as U+FFFD and keeps the last such member, so
// reordering the members changes what it reads. Such objects have no key.
func TestCanonicalLoneSurrogateKey(t *testing.T) {
	pairs := [][2]string{
		{`{"\ud800":"first","\udc00":"second"}`, `{"\udc00":"second","\ud800":"first"}`},
		{`{"\ud800":"first","\ufffd":"second"}`, `{"\ufffd":"second","\ud800":"first"}`},
		{`{"a":{"\udbff":1,"\udfff":2}}`, `{"a":{"\udfff":2,"\udbff":1}}`},
	}
	for _, p := range pairs {
		a, err1 := Canonical(json.RawMessage(p[0]))
		b, err2 := Canonical(json.RawMessage(p[1]))
		if err1 == nil && err2 == nil && string(a) == string(b) {
			t.Errorf("%s and %s both canonicalise to %s", p[0], p[1], a)
		}
	}
	for _, in := range []string{`{"\ud800":1}`, `{"\udc00":1}`, `{"x\ud83dy":1}`, `{"\ud800\u0041":1}`,
		`[{"a":{"\udfff":null}}]`, `{"\ud83d\ud83d":1}`} {
		if _, err := Canonical(json.RawMessage(in)); !errors.Is(err, ErrLoneSurrogateKey) {
			t.Errorf("Canonical(%s) = %v, want ErrLoneSurrogateKey", in, err)
		}
	}
}

func TestCanonicalArgumentsErrors(t *testing.T) {
	for _, in := range []string{`{"a":1,"a":2}`, `{"a":{"b":1,"\u0062":2}}`} {
		if _, err := Canonical(json.RawMessage(in)); !errors.Is(err, ErrDuplicateKey) {
			t.Errorf("Canonical(%s) = %v, want ErrDuplicateKey", in, err)
		}
	}
	for _, in := range []string{`{"n":1e99999999}`, `{"n":1e-2000000}`} {
		if _, err := Canonical(json.RawMessage(in)); !errors.Is(err, ErrNumberRange) {
			t.Errorf("Canonical(%s) = %v, want ErrNumberRange", in, err)
		}
	}
	for _, in := range []string{`{`, `{"a":01}`, `{"a":1,}`, "{\"a\":\"\xff\"}", `{} {}`, `{"a":.5}`, `{"a":NaN}`,
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)} {
		if _, err := Canonical(json.RawMessage(in)); err == nil {
			t.Errorf("Canonical(%q) accepted", in)
		}
	}
}

// TestCanonicalNumbersExact checks number normalisation against an
// independent exact comparison (math/big).
func TestCanonicalNumbersExact(t *testing.T) {
	nums := []string{"0", "1", "-1", "1.5", "0.001", "1e-3", "123456789e-9", "5e300", "-7.25e-10", "1000", "1e3", "0.000e10"}
	for _, a := range nums {
		for _, b := range nums {
			ca, _ := Canonical(json.RawMessage(a))
			cb, _ := Canonical(json.RawMessage(b))
			ra, _ := new(big.Rat).SetString(a)
			rb, _ := new(big.Rat).SetString(b)
			if (string(ca) == string(cb)) != (ra.Cmp(rb) == 0) {
				t.Errorf("%s (%s) vs %s (%s): canonical equality disagrees with exact value", a, ca, b, cb)
			}
		}
	}
}

// FuzzCanonical: the canonical form is valid JSON, is a fixed
// point, and means the same thing to encoding/json, down to the sign of zero
// (outside lone surrogates, which encoding/json collapses).
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{}`, `{"b":[1,2.50,{"x":1e3}],"a":"\u00e9\n"}`, `[1e400]`, `"\ud800"`, `{"a":-0.0}`, `{"\ud800":1,"\udc00":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := Canonical(in)
		if err != nil {
			return
		}
		if !json.Valid(c) {
			t.Fatalf("canonical form %q of %q is not valid JSON", c, in)
		}
		again, err := Canonical(c)
		if err != nil || string(again) != string(c) {
			t.Fatalf("not a fixed point: %q -> %q (%v)", c, again, err)
		}
		var x, y any
		errX := json.Unmarshal(in, &x)
		errY := json.Unmarshal(c, &y)
		if trimmed := strings.TrimSpace(string(in)); trimmed == "" || trimmed == "null" {
			return
		}
		if errX != nil || errY != nil || strings.Contains(string(c), `\ud`) {
			return
		}
		// Compared re-encoded, not with reflect.DeepEqual, for which -0 == 0.
		mx, _ := json.Marshal(x)
		my, _ := json.Marshal(y)
		if string(mx) != string(my) {
			t.Fatalf("meaning changed: %q -> %q (%s, %s)", in, c, mx, my)
		}
	})
}
