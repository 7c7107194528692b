package gateway

import (
	"context"
	"sync/atomic"
	"testing"
)

// Background work started after Close has begun (a reload's schema
// discovery or warm-up, from a reload that outlived the shutdown) does not
// run: Close has stopped waiting for such work, and the engine it would
// use is closed.
func TestBackgroundWorkAfterCloseDoesNotRun(t *testing.T) {
	e := newEnv(t, setup{})
	g := e.gws[0]
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	g.inBackground(func(context.Context) { ran.Store(true) })
	g.warming.Wait()
	if ran.Load() {
		t.Fatal("background work started after Close ran")
	}
}
