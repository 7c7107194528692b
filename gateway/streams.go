package gateway

import (
	"context"
	"sync"
)

// streamSet is the server-initiated streams (GET /mcp) in progress, so that
// a shutdown can end them all (Gateway.EndStreams). Safe for concurrent
// use; the zero value is ready.
type streamSet struct {
	mu      sync.Mutex
	ended   bool
	next    uint64
	cancels map[uint64]context.CancelFunc
}

// add registers a stream's cancel func and returns the func that removes
// it once the stream is over. After end, add cancels at once.
func (s *streamSet) add(cancel context.CancelFunc) (remove func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		cancel()
		return func() {}
	}
	if s.cancels == nil {
		s.cancels = make(map[uint64]context.CancelFunc)
	}
	id := s.next
	s.next++
	s.cancels[id] = cancel
	return func() {
		s.mu.Lock()
		delete(s.cancels, id)
		s.mu.Unlock()
	}
}

// end cancels every stream registered, and every one added later.
func (s *streamSet) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	for id, cancel := range s.cancels {
		cancel()
		delete(s.cancels, id)
	}
}
