// Package jsonscan is the strict JSON reader that mcpgate reads JSON-RPC
// messages with, and the canonical form that tool arguments are keyed on
// (result cache, loop breaker). It reads a value exactly as a strict
// peer would, or refuses it: duplicate members, invalid UTF-8, trailing
// bytes, absurd nesting.
package jsonscan

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of objects and arrays a Scanner (and so
// mcp.Parse and Canonical) accepts. Real MCP messages nest a handful of levels; the
// limit bounds the work a hostile body can cause (the SDK's own limit is 1000,
// so a message refused here for depth is pathological, not legitimate).
const MaxDepth = 128

// errJSON is the root of every syntax error the scanner reports.
var errJSON = errors.New("invalid JSON")

// Scanner is a strict, allocation-light JSON reader over a byte slice. It
// exists instead of encoding/json because the gateway must see a message
// exactly as a strict upstream would: encoding/json matches member names
// case-insensitively and lets a duplicate member silently win, which would
// let a client show the gateway one tool name and the upstream another.
//
// Strings must be valid UTF-8 with no raw control characters. Escaped lone
// surrogates (\ud800) are valid JSON and are kept distinct (WTF-8) rather than
// collapsed to U+FFFD, so two different inputs never decode to the same value.
//
// A Scanner reads one value and is not safe for concurrent use.
type Scanner struct {
	data  []byte
	i     int
	depth int
}

// New returns a Scanner over data.
func New(data []byte) *Scanner { return &Scanner{data: data} }

func (s *Scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at offset %d: %s", errJSON, s.i, fmt.Sprintf(format, args...))
}

func (s *Scanner) ws() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// EOF is what Peek returns at the end of input. It is outside the byte range
// so that a NUL byte in the input (0) is never mistaken for the end: when
// peek returned 0 for both, "{...}\x00{...}" passed for one value followed
// by nothing, while a parser reading on would see a second message.
const EOF = -1

// Peek returns the next byte after whitespace, or EOF at the end of input.
func (s *Scanner) Peek() int {
	s.ws()
	if s.i >= len(s.data) {
		return EOF
	}
	return int(s.data[s.i])
}

func (s *Scanner) expect(c byte) error {
	if s.Peek() != int(c) {
		return s.errorf("expected %q", c)
	}
	s.i++
	return nil
}

func (s *Scanner) enter() error {
	s.depth++
	if s.depth > MaxDepth {
		return s.errorf("nesting deeper than %d", MaxDepth)
	}
	return nil
}

// SkipValue validates one value and returns its raw bytes.
func (s *Scanner) SkipValue() ([]byte, error) {
	c := s.Peek()
	start := s.i
	var err error
	switch {
	case c == '{':
		err = s.Object(func(string) error {
			_, err := s.SkipValue()
			return err
		})
	case c == '[':
		err = s.Array(func() error {
			_, err := s.SkipValue()
			return err
		})
	case c == '"':
		_, _, err = s.Str(nil, false)
	case c == 't':
		err = s.literal("true")
	case c == 'f':
		err = s.literal("false")
	case c == 'n':
		err = s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, err = s.Number()
	case c == EOF:
		err = s.errorf("unexpected end of input")
	default:
		err = s.errorf("unexpected character %q", byte(c))
	}
	if err != nil {
		return nil, err
	}
	return s.data[start:s.i], nil
}

func (s *Scanner) literal(lit string) error {
	if len(s.data)-s.i < len(lit) || string(s.data[s.i:s.i+len(lit)]) != lit {
		return s.errorf("invalid literal")
	}
	s.i += len(lit)
	return nil
}

// Object reads an object, calling member with each decoded key while the
// scanner is positioned on the member's value; member must consume it.
func (s *Scanner) Object(member func(key string) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	if s.Peek() == '}' {
		s.i++
		s.depth--
		return nil
	}
	var keyBuf []byte
	for {
		if s.Peek() != '"' {
			return s.errorf("expected member name")
		}
		var err error
		keyBuf, _, err = s.Str(keyBuf[:0], true)
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		s.ws()
		if err := member(string(keyBuf)); err != nil {
			return err
		}
		switch s.Peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return s.errorf("expected ',' or '}'")
		}
	}
}

// Array reads an array, calling elem with the scanner positioned on each
// element; elem must consume it.
func (s *Scanner) Array(elem func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	if s.Peek() == ']' {
		s.i++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if err := elem(); err != nil {
			return err
		}
		switch s.Peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return s.errorf("expected ',' or ']'")
		}
	}
}

// Str reads a string and, when keep is set, appends its decoded value to dst
// (WTF-8: an escaped lone surrogate becomes its 3-byte generalized UTF-8
// form). lone reports whether such a surrogate was present.
func (s *Scanner) Str(dst []byte, keep bool) (out []byte, lone bool, err error) {
	if s.i >= len(s.data) || s.data[s.i] != '"' {
		return dst, false, s.errorf("expected string")
	}
	s.i++
	for {
		if s.i >= len(s.data) {
			return dst, lone, s.errorf("unterminated string")
		}
		c := s.data[s.i]
		switch {
		case c == '"':
			s.i++
			return dst, lone, nil
		case c == '\\':
			if s.i+1 >= len(s.data) {
				return dst, lone, s.errorf("unterminated escape")
			}
			e := s.data[s.i+1]
			s.i += 2
			var b byte
			switch e {
			case '"', '\\', '/':
				b = e
			case 'b':
				b = '\b'
			case 'f':
				b = '\f'
			case 'n':
				b = '\n'
			case 'r':
				b = '\r'
			case 't':
				b = '\t'
			case 'u':
				r, isLone, ok := s.unicodeEscape()
				if !ok {
					return dst, lone, s.errorf("invalid \\u escape")
				}
				lone = lone || isLone
				if keep {
					if isLone {
						dst = append(dst, 0xED, byte(0x80|(r>>6)&0x3F), byte(0x80|r&0x3F))
					} else {
						dst = utf8.AppendRune(dst, r)
					}
				}
				continue
			default:
				return dst, lone, s.errorf("invalid escape %q", e)
			}
			if keep {
				dst = append(dst, b)
			}
		case c < 0x20:
			return dst, lone, s.errorf("control character in string")
		case c < utf8.RuneSelf:
			if keep {
				dst = append(dst, c)
			}
			s.i++
		default:
			r, size := utf8.DecodeRune(s.data[s.i:])
			if r == utf8.RuneError && size <= 1 {
				return dst, lone, s.errorf("invalid UTF-8 in string")
			}
			if keep {
				dst = append(dst, s.data[s.i:s.i+size]...)
			}
			s.i += size
		}
	}
}

// unicodeEscape decodes the hex digits of a \u escape (the scanner is just
// past "\u"), joining a surrogate pair when one follows. isLone reports an
// unpaired surrogate, returned as is.
func (s *Scanner) unicodeEscape() (r rune, isLone, ok bool) {
	r, ok = s.hex4()
	if !ok {
		return 0, false, false
	}
	if r >= 0xD800 && r < 0xDC00 && s.i+6 <= len(s.data) && s.data[s.i] == '\\' && s.data[s.i+1] == 'u' {
		save := s.i
		s.i += 2
		if r2, ok := s.hex4(); ok && r2 >= 0xDC00 && r2 < 0xE000 {
			return 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00), false, true
		}
		s.i = save
	}
	return r, r >= 0xD800 && r < 0xE000, true
}

func (s *Scanner) hex4() (rune, bool) {
	if s.i+4 > len(s.data) {
		return 0, false
	}
	var r rune
	for _, c := range s.data[s.i : s.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	s.i += 4
	return r, true
}

// Number reads a number with the RFC 8259 grammar and returns its literal.
func (s *Scanner) Number() ([]byte, error) {
	start := s.i
	if s.i < len(s.data) && s.data[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.data) && s.data[s.i] == '0':
		s.i++
	case s.i < len(s.data) && s.data[s.i] >= '1' && s.data[s.i] <= '9':
		s.digits()
	default:
		return nil, s.errorf("invalid number")
	}
	if s.i < len(s.data) && s.data[s.i] == '.' {
		s.i++
		if s.digits() == 0 {
			return nil, s.errorf("invalid number")
		}
	}
	if s.i < len(s.data) && (s.data[s.i] == 'e' || s.data[s.i] == 'E') {
		s.i++
		if s.i < len(s.data) && (s.data[s.i] == '+' || s.data[s.i] == '-') {
			s.i++
		}
		if s.digits() == 0 {
			return nil, s.errorf("invalid number")
		}
	}
	return s.data[start:s.i], nil
}

func (s *Scanner) digits() int {
	n := 0
	for s.i < len(s.data) && s.data[s.i] >= '0' && s.data[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

// End checks that only JSON whitespace (space, tab, LF, CR) follows: any
// other byte, a NUL included, is data a parser reading further would see.
func (s *Scanner) End() error {
	if c := s.Peek(); c != EOF {
		return s.errorf("unexpected %q after the top-level value", byte(c))
	}
	return nil
}

// Valid reports whether data is exactly one valid JSON value by the
// scanner's strict rules.
func Valid(data []byte) bool {
	s := Scanner{data: data}
	if _, err := s.SkipValue(); err != nil {
		return false
	}
	return s.End() == nil
}
