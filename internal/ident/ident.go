// Package ident holds the rules an identity value (a tenant, tier or
// subject) must follow, one definition for the authentication that reads
// them from tokens and the metering that keys usage on them.
package ident

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxTenantBytes bounds a tenant id (and a tier name), in bytes: far below
// what a store keys on (DynamoDB: 2048 bytes for a partition key).
const MaxTenantBytes = 256

// Check returns nil when s is at most maxBytes long, valid UTF-8 (a store's
// encoding would replace invalid bytes, and so merge two values) and free
// of control characters; else an error saying why, without quoting s. It is
// the rule of what can be stored and billed (usage.CheckTenant).
func Check(s string, maxBytes int) error {
	if len(s) > maxBytes {
		return fmt.Errorf("%d bytes, more than %d", len(s), maxBytes)
	}
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("holds control character %U", r)
		}
	}
	return nil
}

// CheckAdmitted is Check for an identity a call is admitted under (read
// from a token, or given by an adapter): it also refuses U+FFFD, what a
// decoder makes of what it cannot read. A JSON decoder turns a token's raw
// invalid byte and its escaped lone surrogate alike into it, so "a\udc00",
// "a\xff" and "a\ufffd" would all be one tenant here while another
// verifier (Python's, a byte-oriented one) reads three. Stored usage keeps
// the rule of Check: records of such a tenant written before this rule
// (an older instance on the same Redis) are still flushed and read.
func CheckAdmitted(s string, maxBytes int) error {
	if err := Check(s, maxBytes); err != nil {
		return err
	}
	if strings.ContainsRune(s, utf8.RuneError) {
		return errors.New("holds U+FFFD, what a decoder makes of invalid input")
	}
	return nil
}
