package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/examples/echo/echopb"
)

// The example runs a server and clients in this process: none of their
// goroutines may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// runs runs the example and checks that every call got its echo, in the
// codec it was made in (codec names the config's).
func runs(t *testing.T, configPath, codec string) {
	t.Helper()
	var out bytes.Buffer
	if err := run(&out, configPath); err != nil {
		t.Fatalf("config %q: %v\n%s", configPath, err, out.String())
	}
	for _, want := range []string{
		`sync:     "echo: hello, sync (` + codec + `)"`,
		`async:    "echo: hello, async (` + codec + `)"`,
		`callback: "echo: hello, callback (` + codec + `)"`,
		`protobuf:    "echo: hello in protobuf (protobuf)"`,
		`json:        "echo: hello in json (json)"`,
		`msgpack:     "echo: hello in msgpack (msgpack)"`,
		`flatbuffers: "echo: hello in flatbuffers (flatbuffers)"`,
		`(code Unimplemented)`,
		"\nok\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("config %q: the output has no %q:\n%s", configPath, want, out.String())
		}
	}
}

// The example must run from its embedded config and from the file beside it.
func TestExampleRuns(t *testing.T) {
	runs(t, "", "protobuf")
	runs(t, "kernrpc.yaml", "protobuf")
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
			runs(t, p, codec)
		})
	}
}

func TestExampleReportsABadConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(p, []byte("service: echo\ncodec: {name: yaml-please}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(io.Discard, p); err == nil {
		t.Fatal("an unknown codec did not fail the example")
	}
}

// The generated message has the methods of the protobuf codec's fast path
// (cmd/protoc-gen-kernrpc's tests show the codec takes it).
var _ interface {
	SizeVT() int
	MarshalToSizedBufferVT([]byte) (int, error)
	UnmarshalVT([]byte) error
	UnmarshalVTUnsafe([]byte) error
} = (*echopb.Echo)(nil)
