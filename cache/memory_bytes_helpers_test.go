package cache

import "testing"

// newBytesStore returns a MemoryStore bounded to maxBytes of values.
func newBytesStore(t testing.TB, maxBytes int64) *MemoryStore {
	t.Helper()
	s, err := NewMemoryStore(&MemoryOptions{MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// heldBytes returns what s's values count toward MaxBytes.
func heldBytes(s *MemoryStore) int64 { return s.heldBytes() }
