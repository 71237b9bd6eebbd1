package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// shapes.proto has what a describe must write back: comments, a nested
// enum and message, a map, a oneof, proto3 optional and repeated fields.
const shapesProto = `syntax = "proto3";
package shapes.v1;

// Shape is drawn.
message Shape {
  // Kind is what it is.
  enum Kind {
    KIND_UNSPECIFIED = 0;
    // A circle.
    KIND_CIRCLE = 1;
  }
  message Point {
    double x = 1;
    double y = 2;
  }
  Kind kind = 1;
  // labels by language.
  map<string, string> labels = 2;
  oneof size {
    double radius = 3;
    Point corner = 4;
  }
  optional int32 z = 5;
  repeated Point points = 6;
}
`

// protoc compiles files in dir into a descriptor set with source info,
// or skips (fails in CI) without protoc.
func protoc(t *testing.T, dir string, files ...string) string {
	t.Helper()
	if _, err := exec.LookPath("protoc"); err != nil {
		if os.Getenv("KERNRPC_REQUIRE_TOOLS") != "" {
			t.Fatal("no protoc on PATH: apt-get install protobuf-compiler")
		}
		t.Skip("no protoc on PATH: apt-get install protobuf-compiler")
	}
	set := filepath.Join(dir, "out.protoset")
	args := append([]string{"-I", dir, "--include_source_info", "--descriptor_set_out=" + set}, files...)
	if out, err := exec.Command("protoc", args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return set
}

// describe writes a message back as .proto: every shape of field with its
// comments, and a file protoc accepts again.
func TestDescribeWritesValidProto(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "shapes.proto"), []byte(shapesProto), 0o644); err != nil {
		t.Fatal(err)
	}
	set := protoc(t, dir, "shapes.proto")
	r := runCmd("", "describe", "-protoset", set, "shapes.v1.Shape")
	r.check(t, "describe a message of every field shape", 0,
		"// shapes.v1.Shape is a message (shapes.proto)\n// Shape is drawn.\nmessage Shape {\n",
		"  // Kind is what it is.\n  enum Kind {\n    KIND_UNSPECIFIED = 0;\n    // A circle.\n    KIND_CIRCLE = 1;\n  }\n",
		"  message Point {\n    double x = 1;\n    double y = 2;\n  }\n",
		"  oneof size {\n    double radius = 3;\n    .shapes.v1.Shape.Point corner = 4;\n  }\n",
		"  .shapes.v1.Shape.Kind kind = 1;\n",
		"  // labels by language.\n  map<string, string> labels = 2;\n",
		"  optional int32 z = 5;\n",
		"  repeated .shapes.v1.Shape.Point points = 6;\n")
	if strings.Contains(r.out, "LabelsEntry") || strings.Contains(r.out, "_z") {
		t.Errorf("describe shows a map entry or a synthetic oneof, which .proto does not declare:\n%s", r.out)
	}

	// What describe wrote, under the same package, compiles again.
	again := filepath.Join(dir, "again")
	if err := os.Mkdir(again, 0o755); err != nil {
		t.Fatal(err)
	}
	body := "syntax = \"proto3\";\npackage shapes.v1;\n" + r.out
	if err := os.WriteFile(filepath.Join(again, "shapes.proto"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	protoc(t, again, "shapes.proto")

	runCmd("", "describe", "-protoset", set, "shapes.v1.Shape.labels").check(t, "describe a field", 0,
		"// shapes.v1.Shape.labels is a field of shapes.v1.Shape (shapes.proto)\n// labels by language.\nmap<string, string> labels = 2;\n")
}
