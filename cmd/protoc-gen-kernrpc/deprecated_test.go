package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

// docs/codegen.md: "An RPC with option deprecated = true gets a
// Deprecated: paragraph, and so does every name of a deprecated service":
// its constants, its server interface and what it holds, its register
// function, its client type, constructor and methods.
func TestDeprecatedNames(t *testing.T) {
	deprecatedRPC := func(name string, cs, ss bool) *descriptorpb.MethodDescriptorProto {
		m := rpc(name, cs, ss)
		m.Options = &descriptorpb.MethodOptions{Deprecated: proto.Bool(true)}
		return m
	}
	old := service("Old", rpc("Say", false, false), deprecatedRPC("Gone", false, false), rpc("Watch", false, true))
	old.Options = &descriptorpb.ServiceOptions{Deprecated: proto.Bool(true)}
	live := service("Live", rpc("Say", false, false), deprecatedRPC("Gone", false, false), deprecatedRPC("Chat", true, true))
	resp := generate(request("", testFile("x/v1/x.proto", old, live)))
	if resp.Error != nil {
		t.Fatal(resp.GetError())
	}
	var src string
	for _, f := range resp.File {
		if strings.HasSuffix(f.GetName(), "_kernrpc.pb.go") {
			src = f.GetContent()
		}
	}
	file, err := parser.ParseFile(token.NewFileSet(), "x_kernrpc.pb.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	// Every exported name the file declares, and whether its doc says it
	// is deprecated.
	got := map[string]bool{}
	deprecated := func(doc *ast.CommentGroup) bool {
		return doc != nil && strings.Contains("\n"+doc.Text(), "\nDeprecated: ")
	}
	for _, d := range file.Decls {
		switch d := d.(type) {
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					doc := s.Doc
					if d.Lparen == token.NoPos {
						doc = d.Doc
					}
					for _, n := range s.Names {
						got[n.Name] = deprecated(doc)
					}
				case *ast.TypeSpec:
					got[s.Name.Name] = deprecated(d.Doc)
					if it, ok := s.Type.(*ast.InterfaceType); ok {
						for _, m := range it.Methods.List {
							got[s.Name.Name+"."+m.Names[0].Name] = deprecated(m.Doc)
						}
					}
				}
			}
		case *ast.FuncDecl:
			name := d.Name.Name
			if d.Recv != nil {
				name = d.Recv.List[0].Type.(*ast.StarExpr).X.(*ast.Ident).Name + "." + name
			}
			got[name] = deprecated(d.Doc)
		}
	}
	want := map[string]bool{}
	for _, n := range []string{
		"Old_ServiceName", "Old_Say_FullMethodName", "Old_Gone_FullMethodName", "Old_Watch_FullMethodName",
		"OldServer", "OldServer.Say", "OldServer.Gone", "OldServer.Watch", "RegisterOldServer",
		"OldClient", "NewOldClient", "OldClient.Say", "OldClient.SayAsync", "OldClient.SayFunc",
		"OldClient.Gone", "OldClient.GoneAsync", "OldClient.GoneFunc", "OldClient.Watch",
		"Live_Gone_FullMethodName", "Live_Chat_FullMethodName", "LiveServer.Gone", "LiveServer.Chat",
		"LiveClient.Gone", "LiveClient.GoneAsync", "LiveClient.GoneFunc", "LiveClient.Chat",
	} {
		want[n] = true
	}
	for _, n := range []string{
		"Live_ServiceName", "Live_Say_FullMethodName", "LiveServer", "LiveServer.Say", "RegisterLiveServer",
		"LiveClient", "NewLiveClient", "LiveClient.Say", "LiveClient.SayAsync", "LiveClient.SayFunc",
	} {
		want[n] = false
	}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		w, ok := want[n]
		switch {
		case !ok:
			t.Errorf("%s is declared, and not expected", n)
		case got[n] != w:
			t.Errorf("%s: deprecated %v, want %v", n, got[n], w)
		}
	}
	for n := range want {
		if _, ok := got[n]; !ok {
			t.Errorf("%s is not declared", n)
		}
	}
}
