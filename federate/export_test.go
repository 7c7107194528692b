package federate

// Subscribers is the number of client sessions holding, or waiting for,
// a subscription to uri: what a test waits for before letting an upstream
// request it holds go on.
func Subscribers(f *Federator, uri string) int {
	f.subs.Lock()
	defer f.subs.Unlock()
	n := 0
	for k, st := range f.subs.by {
		if k.uri == uri {
			n += len(st.sessions)
		}
	}
	return n
}
