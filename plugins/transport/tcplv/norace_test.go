//go:build !race

package tcplv

const raceEnabled = false
