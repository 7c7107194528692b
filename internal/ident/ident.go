// Package ident holds the rules an identity value (a tenant, tier or
// subject) must follow, one definition for the authentication that reads
// them from tokens and the metering that keys usage on them.
package ident

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxTenantBytes bounds a tenant id (and a tier name), in bytes: far below
// what a store keys on (DynamoDB: 2048 bytes for a partition key).
const MaxTenantBytes = 256

// Check returns nil when s is at most maxBytes long, valid UTF-8 (a store's
// encoding would replace invalid bytes, and so merge two values) and free
// of control characters; else an error saying why, without quoting s.
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
