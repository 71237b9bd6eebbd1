//go:build !race

package flatbuffers_test

const raceEnabled = false
