//go:build race

package tcplv

// raceEnabled: the race detector makes sync.Pool drop items on purpose, so
// what a pooled path allocates means nothing under it.
const raceEnabled = true
