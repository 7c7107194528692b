package gateway

import "net/http"

// statusWriter records the status a handler writes (for the server span,
// the audit line and the end of a session).
// Unwrap lets http.NewResponseController reach the server's writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// WriteHeader records the first status and passes it on.
func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200.
func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// Unwrap returns the wrapped writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
