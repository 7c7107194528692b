package mcp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/mcpgate/mcpgate/mcp"
)

// A gateway relays a tools/call and settles it on the upstream's answer
// before its client has the answer: Start, Answer, then Finish.
func ExampleProxy_Start() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(mcp.HeaderSessionID, "s-1")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}`)
	}))
	defer upstream.Close()
	proxy, err := mcp.NewProxy(mcp.ProxyOptions{Upstream: upstream.URL})
	if err != nil {
		panic(err)
	}

	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	x := proxy.Start(w, r, mcp.Forward{Body: []byte(body)})
	x.SetSessionID("bound-" + x.SessionID())
	if result, _, ok := x.Answer(); ok {
		fmt.Println("answer:", string(result))
		fmt.Println("client has it yet:", w.Body.Len() > 0)
	}
	status, err := x.Finish()
	fmt.Println("finished:", status, err, w.Header().Get(mcp.HeaderSessionID))
	// Output:
	// answer: {"content":[],"isError":true}
	// client has it yet: false
	// finished: 200 <nil> bound-s-1
}
