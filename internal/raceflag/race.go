//go:build race

package raceflag

// Enabled: the race detector makes sync.Pool drop items on purpose, so
// what a pooled path allocates means nothing under it.
const Enabled = true
