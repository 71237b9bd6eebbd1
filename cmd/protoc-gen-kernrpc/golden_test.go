package main

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gengo "google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

var update = flag.Bool("update", false, "rewrite the golden files in internal/golden from testdata/proto")

const (
	// goldenDir holds the generated code of testdata/proto, committed:
	// the golden files, and a package tree that its tests build and run.
	goldenDir    = "internal/golden"
	goldenModule = "github.com/kernrpc/kernrpc/cmd/protoc-gen-kernrpc/internal/golden"
	protoDir     = "testdata/proto"
)

// goldenProtos are the files of the test set: two Go packages, one
// importing the other, several services across two files of a package,
// every kind of stream, nested messages, well-known types and comments.
var goldenProtos = []string{
	"kernrpc/gentest/common/v1/common.proto",
	"kernrpc/gentest/v1/greeter.proto",
	"kernrpc/gentest/v1/admin.proto",
}

// TestGolden generates the code of testdata/proto in process, protoc-gen-go's
// beside this plugin's, and compares it with internal/golden; -update
// rewrites internal/golden instead.
func TestGolden(t *testing.T) {
	req := requestFor(t, protoDir, goldenProtos, "module="+goldenModule)
	got := map[string]string{}
	for _, f := range generateGo(t, req).File {
		got[f.GetName()] = f.GetContent()
	}
	resp := generate(req)
	if resp.Error != nil {
		t.Fatalf("generate: %s", resp.GetError())
	}
	for _, f := range resp.File {
		if _, dup := got[f.GetName()]; dup {
			t.Fatalf("protoc-gen-go and protoc-gen-kernrpc both generate %s", f.GetName())
		}
		got[f.GetName()] = f.GetContent()
	}
	// What the set must produce, whatever the golden files say: a file
	// without services (common.proto) gets no _kernrpc.pb.go.
	want := []string{
		"commonv1/common.pb.go", "commonv1/common_vtproto.pb.go",
		"gentestv1/admin.pb.go", "gentestv1/admin_kernrpc.pb.go", "gentestv1/admin_vtproto.pb.go",
		"gentestv1/greeter.pb.go", "gentestv1/greeter_kernrpc.pb.go", "gentestv1/greeter_vtproto.pb.go",
	}
	if names := sortedKeys(got); !slices.Equal(names, want) {
		t.Fatalf("generated files %v, want %v", names, want)
	}
	if *update {
		writeGolden(t, got)
		return
	}
	compareGolden(t, got, "go test ./cmd/protoc-gen-kernrpc -run TestGolden -update")
}

// requestFor compiles files (paths under dir) with protoc into a
// descriptor set and makes the request protoc would send a plugin with
// parameter param. The compiler version is left out, so that the golden
// files do not change with protoc's.
func requestFor(t *testing.T, dir string, files []string, param string) *pluginpb.CodeGeneratorRequest {
	t.Helper()
	protoc := requireTool(t, "protoc", "apt-get install protobuf-compiler libprotobuf-dev")
	set := filepath.Join(t.TempDir(), "set.pb")
	args := append([]string{"--proto_path=" + dir, "--include_imports", "--include_source_info", "--descriptor_set_out=" + set}, files...)
	if out, err := exec.Command(protoc, args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	b, err := os.ReadFile(set)
	if err != nil {
		t.Fatal(err)
	}
	var fds descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &fds); err != nil {
		t.Fatalf("decode protoc's descriptor set: %v", err)
	}
	// protoc lists a file after its imports, as a request must.
	return &pluginpb.CodeGeneratorRequest{FileToGenerate: files, Parameter: proto.String(param), ProtoFile: fds.File}
}

// generateGo is protoc-gen-go, at the version go.mod selects, run in
// process on req.
func generateGo(t *testing.T, req *pluginpb.CodeGeneratorRequest) *pluginpb.CodeGeneratorResponse {
	t.Helper()
	gen, err := protogen.Options{}.New(req)
	if err != nil {
		t.Fatalf("protoc-gen-go: %v", err)
	}
	for _, f := range gen.Files {
		if f.Generate {
			gengo.GenerateFile(gen, f)
		}
	}
	resp := gen.Response()
	if resp.Error != nil {
		t.Fatalf("protoc-gen-go: %s", resp.GetError())
	}
	return resp
}

func writeGolden(t *testing.T, got map[string]string) {
	t.Helper()
	for _, stale := range goldenFiles(t) {
		if _, ok := got[stale]; !ok {
			if err := os.Remove(filepath.Join(goldenDir, stale)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, content := range got {
		p := filepath.Join(goldenDir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d files into %s", len(got), goldenDir)
}

func compareGolden(t *testing.T, got map[string]string, fix string) {
	t.Helper()
	for _, name := range goldenFiles(t) {
		if _, ok := got[name]; !ok {
			t.Errorf("%s/%s is no longer generated from %s; run %s", goldenDir, name, protoDir, fix)
		}
	}
	for _, name := range sortedKeys(got) {
		want, err := os.ReadFile(filepath.Join(goldenDir, filepath.FromSlash(name)))
		if err != nil {
			t.Errorf("%s/%s: %v; run %s", goldenDir, name, err, fix)
			continue
		}
		if d := firstDifference(string(want), got[name]); d != "" {
			t.Errorf("%s/%s differs from what the generator makes of %s now (%s); if the change is meant, run %s", goldenDir, name, protoDir, d, fix)
		}
	}
}

// goldenFiles lists the generated files under goldenDir, slash-separated.
func goldenFiles(t *testing.T) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(goldenDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".pb.go") {
			return err
		}
		rel, _ := filepath.Rel(goldenDir, p)
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return names
}

// firstDifference describes the first line where want and got part, or
// returns "" if they are equal.
func firstDifference(want, got string) string {
	if want == got {
		return ""
	}
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl || i >= len(w) || i >= len(g) {
			return fmt.Sprintf("line %d is %q, the generator writes %q", i+1, wl, gl)
		}
	}
	return "they differ"
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// requireTool finds an installed program: without it the test skips,
// except under KERNRPC_REQUIRE_TOOLS=1 (CI), where it fails.
func requireTool(t *testing.T, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("KERNRPC_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%s is not installed, and KERNRPC_REQUIRE_TOOLS=1 requires it: %s", name, install)
	}
	t.Skipf("%s is not installed (%s); set KERNRPC_REQUIRE_TOOLS=1 to fail instead", name, install)
	return ""
}
