package enforce

// ShutdownHasWork reports whether e's shutdown would have usage to write
// (see meterer.hasWork): a test's premise, checked rather than assumed.
func ShutdownHasWork(e *Engine) bool {
	return e.lim.meters != nil && e.lim.meters.hasWork()
}

// JournaledCalls is how many calls e's journals hold: calls whose charge
// landed and was answered (first time or placed again), not yet known to
// the durable store. A test waits on it to know an op was placed again,
// which PendingUsage alone cannot tell (an op being placed is in neither).
func JournaledCalls(e *Engine) int64 {
	m := e.lim.meters
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, j := range m.journal {
		for _, en := range j.entries {
			n += en.delta.Calls
		}
	}
	return n
}
