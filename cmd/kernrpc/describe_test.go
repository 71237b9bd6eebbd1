package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
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
	set := compileProto(t, t.TempDir(), "shapes.proto", shapesProto)
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
	compileProto(t, t.TempDir(), "shapes.proto", "syntax = \"proto3\";\npackage shapes.v1;\n"+r.out)

	runCmd("", "describe", "-protoset", set, "shapes.v1.Shape.labels").check(t, "describe a field", 0,
		"// shapes.v1.Shape.labels is a field of shapes.v1.Shape (shapes.proto)\n// labels by language.\nmap<string, string> labels = 2;\n")
}

// legacy.proto has what proto2 and the standard options add to a
// declaration: defaults, a JSON name, packed, deprecated, reserved numbers
// and names, extension ranges, enum aliases, a method's idempotency level.
const legacyProto = `syntax = "proto2";
package legacy.v1;

message Old {
  option deprecated = true;
  enum Mode {
    option allow_alias = true;
    MODE_OFF = 0;
    MODE_DISABLED = 0;
    MODE_ON = 1 [deprecated = true];
    reserved 5 to 9, 100 to max;
    reserved "MODE_GONE";
  }
  optional string name = 1 [default = "caf\303\251 \"q\"\n"];
  optional int32 count = 2 [default = -7, json_name = "n"];
  optional double ratio = 3 [default = inf];
  optional Mode mode = 4 [default = MODE_ON];
  repeated int32 ids = 5 [packed = true, deprecated = true];
  optional bytes blob = 6 [default = "\000\377"];
  optional uint64 big = 7 [default = 18446744073709551615];
  optional float f = 8 [default = 1.5];
  optional string user_id = 9;
  extensions 100 to 199, 1000 to max;
  reserved 10, 20 to 29;
  reserved "gone", "older";
}

service Legacy {
  option deprecated = true;
  rpc Get(Old) returns (Old) {
    option idempotency_level = NO_SIDE_EFFECTS;
  }
  rpc Put(Old) returns (Old);
}
`

// describe writes back what changes what a caller sends or gets (proto2
// defaults, JSON names, reserved numbers) and the standard options a
// caller acts on, in a file protoc compiles into the same descriptors.
func TestDescribeWritesDefaultsReservedAndOptions(t *testing.T) {
	set := compileProto(t, t.TempDir(), "legacy.proto", legacyProto)
	msg := runCmd("", "describe", "-protoset", set, "legacy.v1.Old")
	msg.check(t, "describe a proto2 message", 0,
		"message Old {\n  option deprecated = true;\n",
		"    option allow_alias = true;\n",
		"    MODE_ON = 1 [deprecated = true];\n",
		"    reserved 5 to 9, 100 to max;\n    reserved \"MODE_GONE\";\n",
		`optional string name = 1 [default = "caf\303\251 \"q\"\012"];`,
		`optional int32 count = 2 [default = -7, json_name = "n"];`,
		"optional double ratio = 3 [default = inf];",
		"optional .legacy.v1.Old.Mode mode = 4 [default = MODE_ON];",
		"repeated int32 ids = 5 [packed = true, deprecated = true];",
		`optional bytes blob = 6 [default = "\000\377"];`,
		"optional uint64 big = 7 [default = 18446744073709551615];",
		"optional float f = 8 [default = 1.5];",
		"optional string user_id = 9;\n",
		"  extensions 100 to 199, 1000 to max;\n  reserved 10, 20 to 29;\n  reserved \"gone\", \"older\";\n}")
	svc := runCmd("", "describe", "-protoset", set, "legacy.v1.Legacy")
	svc.check(t, "describe a service with options", 0,
		"service Legacy {\n  option deprecated = true;\n",
		"  rpc Get(.legacy.v1.Old) returns (.legacy.v1.Old) {\n    option idempotency_level = NO_SIDE_EFFECTS;\n  }\n",
		"  rpc Put(.legacy.v1.Old) returns (.legacy.v1.Old);\n")

	// Written back under the same package, it compiles into the same
	// descriptors: nothing describe left out changes the contract.
	again := compileProto(t, t.TempDir(), "legacy.proto", "syntax = \"proto2\";\npackage legacy.v1;\n"+msg.out+svc.out)
	if a, b := readSet(t, set), readSet(t, again); !proto.Equal(a, b) {
		t.Errorf("describe's output compiles into other descriptors:\n%s\nwant\n%s", prototext.Format(b), prototext.Format(a))
	}
}

// compileProto writes body as dir/name and compiles it (protoc).
func compileProto(t *testing.T, dir, name, body string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return protoc(t, dir, name)
}

// readSet reads a descriptor set's one file, without source info (the
// comments and positions describe does not keep).
func readSet(t *testing.T, path string) *descriptorpb.FileDescriptorProto {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	f := set.GetFile()[0]
	f.SourceCodeInfo = nil
	return f
}
