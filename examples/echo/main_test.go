package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The example runs a server and clients in this process: none of their
// goroutines may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The example must run from its embedded config and from the file beside it.
func TestExampleRuns(t *testing.T) {
	if err := run(""); err != nil {
		t.Fatalf("embedded config: %v", err)
	}
	if err := run("kernrpc.yaml"); err != nil {
		t.Fatalf("kernrpc.yaml: %v", err)
	}
}

// Changing the codec line of kernrpc.yaml is all it takes to run the
// example on another codec.
func TestExampleRunsWithEveryCodec(t *testing.T) {
	orig, err := os.ReadFile("kernrpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const line = "codec:\n  name: protobuf"
	if strings.Count(string(orig), line) != 1 {
		t.Fatalf("kernrpc.yaml has no single %q to change", line)
	}
	for _, codec := range []string{"json", "msgpack", "flatbuffers"} {
		t.Run(codec, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "kernrpc.yaml")
			changed := strings.Replace(string(orig), line, "codec:\n  name: "+codec, 1)
			if err := os.WriteFile(p, []byte(changed), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := run(p); err != nil {
				t.Fatalf("with codec %s: %v", codec, err)
			}
		})
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
