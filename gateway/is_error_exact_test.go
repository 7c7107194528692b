package gateway

import "testing"

// isErrorResult reads isError as MCP clients do: the member named exactly
// so (JSON.parse, Python's json and the Go SDK's case-sensitive decoding
// ignore a case twin), the last of duplicates winning. encoding/json's
// case-insensitive match let "ISERROR": false after "isError": true turn an
// error the client sees into a success for the breaker, the cache and the
// invalidations.
func TestIsErrorResultReadsExactMember(t *testing.T) {
	for _, tt := range []struct {
		result string
		want   bool
	}{
		{`{"isError":true}`, true},
		{`{"isError":false}`, false},
		{`{"content":[]}`, false},
		{`{"isError":true,"ISERROR":false}`, true},
		{`{"IsError":true}`, false},
		{`{"isError":false,"isError":true}`, true},
		{`{"isError":true,"isError":false}`, false},
		{`{"is\u0045rror":true}`, true},
		{`{"isError":"true"}`, false},
		{`[true]`, false},
		{`{"isError":true`, false},
	} {
		if got := isErrorResult([]byte(tt.result)); got != tt.want {
			t.Errorf("isErrorResult(%s) = %v, want %v", tt.result, got, tt.want)
		}
	}
}
