//go:build linux && !race

package tcplv

// raceIOEdge is rawio_race.go's, for race-enabled builds alone.
func raceIOEdge() {}
