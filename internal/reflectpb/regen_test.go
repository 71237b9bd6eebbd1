package reflectpb_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The committed generated files, and the descriptor sets of testpb, are
// what protoc makes of the .proto files now: the commands are the lines
// of gen.go that start with go:generate. Without protoc or the
// protoc-gen-go of go.mod's version the test is skipped (failed, with
// KERNRPC_REQUIRE_TOOLS=1, as in CI).
func TestCommittedFilesAreRegenerated(t *testing.T) {
	protoc := tool(t, "protoc")
	gen := tool(t, "protoc-gen-go")
	version := protobufVersion(t)
	want := "protoc-gen-go " + version
	if out, err := exec.Command(gen, "--version").Output(); err != nil || strings.TrimSpace(string(out)) != want {
		skip(t, "%s --version says %q (%v), want %q: go install google.golang.org/protobuf/cmd/protoc-gen-go@%s", gen, bytes.TrimSpace(out), err, want, version)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	protos := []string{"internal/reflectpb/reflection.proto", "internal/reflectpb/testpb/types.proto", "internal/reflectpb/testpb/service.proto"}
	run(t, protoc, append([]string{"--proto_path=" + root, "--go_out=" + out, "--go_opt=paths=source_relative"}, protos...)...)
	run(t, protoc, "--proto_path="+root, "--include_imports", "--descriptor_set_out="+filepath.Join(out, "notes.protoset"), "internal/reflectpb/testpb/service.proto")
	testdata := filepath.Join(root, "internal/reflectpb/testpb/testdata")
	run(t, protoc, "--proto_path="+testdata, "--include_imports", "--descriptor_set_out="+filepath.Join(out, "gateway.protoset"), filepath.Join(testdata, "gateway.proto"))
	for got, committed := range map[string]string{
		"internal/reflectpb/reflection.pb.go":     "internal/reflectpb/reflection.pb.go",
		"internal/reflectpb/testpb/types.pb.go":   "internal/reflectpb/testpb/types.pb.go",
		"internal/reflectpb/testpb/service.pb.go": "internal/reflectpb/testpb/service.pb.go",
		"notes.protoset":                          "internal/reflectpb/testpb/testdata/notes.protoset",
		"gateway.protoset":                        "internal/reflectpb/testpb/testdata/gateway.protoset",
	} {
		fresh, err := os.ReadFile(filepath.Join(out, got))
		if err != nil {
			t.Fatal(err)
		}
		old, err := os.ReadFile(filepath.Join(root, committed))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, old) {
			t.Errorf("%s is not what protoc makes of its .proto now: run go generate ./internal/reflectpb/... and commit it", committed)
		}
	}
}

func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		skip(t, "%s is not on PATH (see gen.go for how to install it)", name)
	}
	return p
}

func skip(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("KERNRPC_REQUIRE_TOOLS") == "1" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// protobufVersion is the version of google.golang.org/protobuf the core
// go.mod requires. (A test binary of a package that is not main carries
// no module versions in its build info.)
func protobufVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "google.golang.org/protobuf" {
			return f[1]
		}
	}
	t.Fatal("go.mod requires no google.golang.org/protobuf")
	return ""
}
