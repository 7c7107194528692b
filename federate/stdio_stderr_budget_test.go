package federate

import (
	"testing"
	"time"
)

// A process's stderr lines are logged up to stderrPerSecond a second; the
// first line logged after some were refused tells how many.
func TestLineBudget(t *testing.T) {
	var b lineBudget
	t0 := time.Unix(1000, 0)
	for i := range stderrPerSecond {
		if ok, dropped := b.take(t0.Add(time.Duration(i) * time.Microsecond)); !ok || dropped != 0 {
			t.Fatalf("line %d: take = %v, %d; want true, 0", i, ok, dropped)
		}
	}
	for i := range 5 {
		if ok, _ := b.take(t0.Add(999 * time.Millisecond)); ok {
			t.Fatalf("line %d past the budget was allowed", stderrPerSecond+i)
		}
	}
	if ok, dropped := b.take(t0.Add(time.Second)); !ok || dropped != 5 {
		t.Errorf("first line of the next second: take = %v, %d; want true, 5", ok, dropped)
	}
	if ok, dropped := b.take(t0.Add(time.Second)); !ok || dropped != 0 {
		t.Errorf("second line of the next second: take = %v, %d; want true, 0", ok, dropped)
	}
}
