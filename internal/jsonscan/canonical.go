package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// ErrDuplicateKey means a JSON object has the same member name twice (after
// unescaping). Such a document has no single meaning: parsers disagree on
// which member wins, so it cannot be given a canonical form.
var ErrDuplicateKey = errors.New("jsonscan: duplicate object member")

// ErrLoneSurrogateKey means a member name contains an escaped lone surrogate
// (\ud800-\udfff not in a pair). Parsers disagree on what such a name is:
// Go decodes every one as U+FFFD (so "\ud800", "\udc00" and "\ufffd" are
// one name there and the last member wins), JavaScript keeps it as written.
// Sorting the members would hide which one an upstream reads, so the object
// has no canonical form.
var ErrLoneSurrogateKey = errors.New("jsonscan: lone surrogate in object member name")

// ErrNumberRange means a number's exponent is too large to normalise.
var ErrNumberRange = errors.New("jsonscan: number out of range")

// maxExponent bounds decimal exponents (far beyond float64's ±308, so every
// number a tool can decode survives normalisation exactly).
const maxExponent = 1 << 20

// Canonical returns the canonical JSON form of a tools/call
// arguments value, the form the result cache and the loop breaker key on:
// two arguments that mean the same thing give the same bytes.
//
//   - Object members are sorted by name (byte order of their UTF-8 form) and
//     whitespace is removed.
//   - Numbers are normalised by exact decimal value: 1, 1.0, 1e0, 10e-1 and
//     0.1e1 all become 1. Zero keeps its sign: -0, -0.0 and -0e5 become -0
//     and positive zeros 0, since Go and JavaScript upstreams decode -0 as a
//     different float64 (1/x is -Inf). No float64 rounding is involved, so
//     numbers that differ only beyond float64 precision stay distinct (a
//     cache miss, never a wrong hit).
//   - Strings are re-escaped one way only: ", \ and control characters are
//     escaped (\n, \t, \r, \b, \f or \u00xx), everything else is literal
//     UTF-8 (no HTML escaping). An escaped lone surrogate in a string value
//     stays a distinct \udxxx escape rather than collapsing into U+FFFD:
//     values a Go upstream reads alike get two keys, at worst a miss.
//   - Absent, empty and null arguments are all {}: MCP treats them alike.
//
// Invalid JSON, raw invalid UTF-8, nesting deeper than MaxDepth, a duplicate
// member (ErrDuplicateKey), a member name with an escaped lone surrogate
// (ErrLoneSurrogateKey) or an absurd exponent (ErrNumberRange) is an
// error. Canonical does not require an object: any JSON value is
// canonicalised.
func Canonical(raw json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return []byte("{}"), nil
	}
	s := Scanner{data: raw}
	out, err := s.canonical(make([]byte, 0, len(raw)))
	if err != nil {
		return nil, err
	}
	if err := s.End(); err != nil {
		return nil, err
	}
	return out, nil
}

type canonMember struct {
	key string // decoded, WTF-8
	val []byte // canonical
}

func (s *Scanner) canonical(dst []byte) ([]byte, error) {
	switch c := s.Peek(); {
	case c == '{':
		var members []canonMember
		err := s.Object(func(key string) error {
			// Str refuses raw invalid UTF-8 and joins a valid pair into one
			// rune: what is left invalid in a key (WTF-8) is a lone surrogate.
			if !utf8.ValidString(key) {
				return fmt.Errorf("%w %q", ErrLoneSurrogateKey, key)
			}
			v, err := s.canonical(nil)
			members = append(members, canonMember{key, v})
			return err
		})
		if err != nil {
			return nil, err
		}
		slices.SortFunc(members, func(a, b canonMember) int {
			switch {
			case a.key < b.key:
				return -1
			case a.key > b.key:
				return 1
			}
			return 0
		})
		dst = append(dst, '{')
		for i, m := range members {
			if i > 0 {
				if members[i-1].key == m.key {
					return nil, fmt.Errorf("%w %q", ErrDuplicateKey, m.key)
				}
				dst = append(dst, ',')
			}
			dst = AppendString(dst, m.key)
			dst = append(dst, ':')
			dst = append(dst, m.val...)
		}
		return append(dst, '}'), nil
	case c == '[':
		dst = append(dst, '[')
		first := true
		err := s.Array(func() error {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var err error
			dst, err = s.canonical(dst)
			return err
		})
		if err != nil {
			return nil, err
		}
		return append(dst, ']'), nil
	case c == '"':
		v, _, err := s.Str(nil, true)
		if err != nil {
			return nil, err
		}
		return AppendString(dst, string(v)), nil
	case c == '-' || (c >= '0' && c <= '9'):
		lit, err := s.Number()
		if err != nil {
			return nil, err
		}
		return AppendNumber(dst, lit)
	default:
		v, err := s.SkipValue() // true, false, null or a syntax error
		if err != nil {
			return nil, err
		}
		return append(dst, v...), nil
	}
}

const hexDigits = "0123456789abcdef"

// AppendString writes s (WTF-8) as a JSON string with the single
// escaping scheme documented on Canonical.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\b':
				dst = append(dst, '\\', 'b')
			case c == '\f':
				dst = append(dst, '\\', 'f')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		// A WTF-8 surrogate (ED A0..BF xx) can only come from a lone
		// surrogate escape: the scanner refuses raw invalid UTF-8.
		if c == 0xED && i+2 < len(s) && s[i+1] >= 0xA0 {
			r := rune(0xD000) | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
			dst = append(dst, '\\', 'u',
				hexDigits[r>>12&0xF], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
			i += 3
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		dst = append(dst, s[i:i+size]...)
		i += size
	}
	return append(dst, '"')
}

// AppendNumber writes the number literal lit (already validated) in
// its canonical form: the shortest integer form when the value is an integer
// of at most 21 digits, otherwise d[.ddd]e±n with no leading or trailing
// zeros in the digits. A negative zero is -0.
func AppendNumber(dst, lit []byte) ([]byte, error) {
	neg := lit[0] == '-'
	if neg {
		lit = lit[1:]
	}
	// value = mant × 10^exp, mant being the decimal digits.
	var mant []byte
	exp := 0
	i := 0
	for ; i < len(lit) && lit[i] >= '0' && lit[i] <= '9'; i++ {
		mant = append(mant, lit[i])
	}
	if i < len(lit) && lit[i] == '.' {
		i++
		for ; i < len(lit) && lit[i] >= '0' && lit[i] <= '9'; i++ {
			mant = append(mant, lit[i])
			exp--
		}
	}
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		e := lit[i+1:]
		eneg := false
		if e[0] == '+' || e[0] == '-' {
			eneg = e[0] == '-'
			e = e[1:]
		}
		e = bytes.TrimLeft(e, "0")
		if len(e) > 7 {
			return nil, ErrNumberRange
		}
		n := 0
		for _, d := range e {
			n = n*10 + int(d-'0')
		}
		if n > maxExponent {
			return nil, ErrNumberRange
		}
		if eneg {
			n = -n
		}
		exp += n
	}
	// Strip leading zeros, then trailing zeros into the exponent.
	mant = bytes.TrimLeft(mant, "0")
	for len(mant) > 0 && mant[len(mant)-1] == '0' {
		mant = mant[:len(mant)-1]
		exp++
	}
	if neg {
		dst = append(dst, '-')
	}
	if len(mant) == 0 {
		return append(dst, '0'), nil
	}
	if exp >= 0 && len(mant)+exp <= 21 {
		dst = append(dst, mant...)
		for range exp {
			dst = append(dst, '0')
		}
		return dst, nil
	}
	// Scientific: d.ddd × 10^(exp + len(mant) - 1).
	dst = append(dst, mant[0])
	if len(mant) > 1 {
		dst = append(dst, '.')
		dst = append(dst, mant[1:]...)
	}
	dst = append(dst, 'e')
	return strconv.AppendInt(dst, int64(exp+len(mant)-1), 10), nil
}
