package plugintest

import "flag"

// longRun turns on the long variants of the suite's checks: larger values,
// more inputs, longer waits. They are off by default so that a plugin's
// test stays fast; run them with
//
//	go test ./path/to/plugin -plugintest.long
//
// (the flag exists in every test binary that imports plugintest, so give
// it only with packages that do). Each suite's documentation says what
// the flag adds to it.
var longRun = flag.Bool("plugintest.long", false,
	"plugintest: also run the long variants of the conformance checks (larger values, more inputs)")

// long reports whether -plugintest.long was given.
func long() bool { return *longRun }
