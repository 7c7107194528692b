package enforce

// ShutdownHasWork reports whether e's shutdown would have usage to write
// (see meterer.hasWork): a test's premise, checked rather than assumed.
func ShutdownHasWork(e *Engine) bool {
	return e.lim.meters != nil && e.lim.meters.hasWork()
}
