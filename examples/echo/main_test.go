package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The example must run from its embedded config and from the file beside it.
func TestExampleRuns(t *testing.T) {
	if err := run(""); err != nil {
		t.Fatalf("embedded config: %v", err)
	}
	if err := run("kernrpc.yaml"); err != nil {
		t.Fatalf("kernrpc.yaml: %v", err)
	}
}

func TestExampleReportsABadConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(p, []byte("service: echo\ncodec: {name: yaml-please}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(p); err == nil {
		t.Fatal("an unknown codec did not fail the example")
	}
}
