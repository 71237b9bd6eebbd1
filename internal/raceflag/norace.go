//go:build !race

// Package raceflag says whether the race detector is on, for tests that
// count allocations: under it, sync.Pool drops items on purpose.
package raceflag

// Enabled reports whether the race detector is on.
const Enabled = false
