// Package stats holds the small statistics and table helpers the benchmark
// reports share.
package stats

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Median is the median of xs (the mean of the middle two for an even
// count); 0 for none. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Percentile returns the q-quantile (0 < q < 1) of sorted by the
// nearest-rank method: the smallest value with at least q of all values at
// or below it. 0 for none.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// WriteTable writes rows as a Markdown table, the first row as its header,
// with columns padded so that it reads as well in a terminal.
func WriteTable(w io.Writer, rows [][]string) {
	if len(rows) == 0 {
		return
	}
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			fmt.Fprintf(&b, " %-*s |", width[i], c)
		}
		fmt.Fprintln(w, b.String())
	}
	line(rows[0])
	sep := make([]string, len(width))
	for i, n := range width {
		sep[i] = strings.Repeat("-", n)
	}
	line(sep)
	for _, row := range rows[1:] {
		line(row)
	}
}
