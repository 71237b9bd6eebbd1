package plugintest

import (
	"context"
	"testing"
)

// tb is the part of *testing.T the suite uses. It is an interface, not
// *testing.T itself, so that plugintest's own tests can run the suite
// against deliberately broken plugins under a recorder and assert which
// subtest failed.
type tb interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Failed() bool
	Cleanup(func())
	TempDir() string
	Context() context.Context
	Run(name string, f func(t tb)) bool
}

// testingT adapts *testing.T to tb.
type testingT struct{ *testing.T }

func (t testingT) Run(name string, f func(t tb)) bool {
	return t.T.Run(name, func(t *testing.T) { f(testingT{t}) })
}

func wrap(t *testing.T) tb { return testingT{t} }
