package stats

import (
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	for q, want := range map[float64]time.Duration{0.5: 50, 0.99: 99, 0.999: 100, 0.001: 1} {
		if got := Percentile(d, q); got != want {
			t.Errorf("Percentile(1..100, %v) = %v, want %v", q, got, want)
		}
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("Percentile(nil) = %v", got)
	}
	if got := Percentile(d[:1], 0.99); got != 1 {
		t.Errorf("Percentile of one = %v", got)
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	WriteTable(&b, [][]string{{"a", "long header"}, {"value", "x"}})
	want := "| a     | long header |\n| ----- | ----------- |\n| value | x           |\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
