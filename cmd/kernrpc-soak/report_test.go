package main

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The report's figures sit right under their headings: each heading ends
// where its column's values end.
func TestReportColumnsLineUpWithTheirHeadings(t *testing.T) {
	var out bytes.Buffer
	f := figures{goroutines: 123, heap: 45 << 20, fds: 17}
	report(&out, 3, f, f, f, f, nil)
	lines := strings.Split(strings.TrimPrefix(out.String(), "\n"), "\n")
	h := regexp.MustCompile(`(goroutines) +(heap) +(fds)$`).FindStringSubmatchIndex(lines[0])
	if h == nil {
		t.Fatalf("no headings in %q", lines[0])
	}
	head := []int{h[3], h[5], h[7]}
	cells := regexp.MustCompile(`(\d+) +(\d+\.\d MiB) +(\d+)$`)
	for _, row := range lines[1:5] {
		c := cells.FindStringSubmatchIndex(row)
		if c == nil {
			t.Fatalf("row %q has no figures", row)
		}
		if got := []int{c[3], c[5], c[7]}; !slices.Equal(got, head) {
			t.Errorf("figures end at columns %v, their headings at %v:\n%s", got, head, out.String())
		}
	}
}
