package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The example runs a server and a client in this process: none of their
// goroutines may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A program importing only the engine finds every default plugin.
func TestTheEngineAloneRunsOnTheDefaults(t *testing.T) {
	got, err := run(context.Background(), "test")
	if err != nil || got != "hello, test" {
		t.Fatalf("run = %q, %v; want the defaults built in", got, err)
	}
}

// The claim above holds only while this package imports no plugin: keep
// it so.
func TestImportsOnlyTheEngine(t *testing.T) {
	// go test puts its own GOROOT/bin first on PATH.
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.HasPrefix(imp, "github.com/kernrpc/kernrpc/") {
			t.Errorf("imports %s; the example must show the engine alone", imp)
		}
	}
}
