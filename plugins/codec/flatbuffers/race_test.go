//go:build race

package flatbuffers_test

// raceEnabled: the race detector makes sync.Pool drop items on purpose, so
// allocation counts of pooled paths mean nothing under it.
const raceEnabled = true
