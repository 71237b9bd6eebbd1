package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// Messages may come from a Go package whose import path ends in a name
// the generated client methods use for a local (the receiver x, ctx, req,
// opts, resp, err, done, fn, c): the generated code must still compile,
// for every kind of RPC.
func TestMessagesFromAPackageNamedLikeALocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds generated code")
	}
	dir, err := os.MkdirTemp("internal", "localsgen")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	base := "github.com/kernrpc/kernrpc/cmd/protoc-gen-kernrpc/" + filepath.ToSlash(dir)

	var files []*descriptorpb.FileDescriptorProto
	svc := &descriptorpb.FileDescriptorProto{
		Name: proto.String("svc/svc.proto"), Package: proto.String("locals.svc"), Syntax: proto.String("proto3"),
		Options: &descriptorpb.FileOptions{GoPackage: proto.String(base + "/svc")},
	}
	for _, local := range []string{"x", "ctx", "req", "opts", "resp", "err", "done", "fn", "c"} {
		name := local + "/m.proto"
		files = append(files, &descriptorpb.FileDescriptorProto{
			Name: proto.String(name), Package: proto.String("locals." + local), Syntax: proto.String("proto3"),
			Options:     &descriptorpb.FileOptions{GoPackage: proto.String(base + "/" + local)},
			MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Req")}, {Name: proto.String("Resp")}},
		})
		svc.Dependency = append(svc.Dependency, name)
		s := &descriptorpb.ServiceDescriptorProto{Name: proto.String("S_" + local)}
		for _, k := range []struct {
			name           string
			client, server bool
		}{{"Unary", false, false}, {"ServerStream", false, true}, {"ClientStream", true, false}, {"Bidi", true, true}} {
			s.Method = append(s.Method, &descriptorpb.MethodDescriptorProto{
				Name: proto.String(k.name), InputType: proto.String(".locals." + local + ".Req"), OutputType: proto.String(".locals." + local + ".Resp"),
				ClientStreaming: proto.Bool(k.client), ServerStreaming: proto.Bool(k.server),
			})
		}
		svc.Service = append(svc.Service, s)
	}
	files = append(files, svc)
	req := &pluginpb.CodeGeneratorRequest{ProtoFile: files, Parameter: proto.String("module=" + base)}
	for _, f := range files {
		req.FileToGenerate = append(req.FileToGenerate, f.GetName())
	}

	out := generateGo(t, req).File
	resp := generate(req)
	if resp.Error != nil {
		t.Fatalf("generate: %s", resp.GetError())
	}
	for _, f := range append(out, resp.File...) {
		p := filepath.Join(dir, filepath.FromSlash(f.GetName()))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.GetContent()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// go test puts its own go first on the PATH.
	cmd := exec.Command("go", "build", "-gcflags=-e", "./"+filepath.ToSlash(dir)+"/...")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the generated code does not compile: %v\n%s", err, b)
	}
}
