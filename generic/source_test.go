package generic_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/kernrpc/kernrpc/generic"
)

const (
	notesSet   = "../internal/reflectpb/testpb/testdata/notes.protoset"
	gatewaySet = "../internal/reflectpb/testpb/testdata/gateway.protoset"
)

func TestDescriptorSetListsItsServices(t *testing.T) {
	src, err := generic.LoadDescriptorSet(notesSet)
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := src.Services(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 1 || svcs[0].Name != "kernrpc.reflecttest.v1.Notes" || !svcs[0].Described || svcs[0].File != "internal/reflectpb/testpb/service.proto" {
		t.Fatalf("services: %+v, want Notes alone, described", svcs)
	}
	want := []generic.Method{
		{Name: notes + "Chat", Kind: generic.BidiStreaming, Input: "kernrpc.reflecttest.v1.Note", Output: "kernrpc.reflecttest.v1.Note"},
		{Name: notes + "Echo", Kind: generic.Unary, Input: "kernrpc.reflecttest.v1.Note", Output: "kernrpc.reflecttest.v1.Note"},
		{Name: notes + "Join", Kind: generic.ClientStreaming, Input: "kernrpc.reflecttest.v1.Note", Output: "kernrpc.reflecttest.v1.Note"},
		{Name: notes + "Split", Kind: generic.ServerStreaming, Input: "kernrpc.reflecttest.v1.Note", Output: "kernrpc.reflecttest.v1.Note"},
	}
	if got := svcs[0].Methods; len(got) != len(want) {
		t.Fatalf("methods: %+v, want %+v", got, want)
	}
	for i, w := range want {
		if svcs[0].Methods[i] != w {
			t.Errorf("method %d: %+v, want %+v", i, svcs[0].Methods[i], w)
		}
	}
	md, err := generic.FindMethod(context.Background(), src, notes+"Split")
	if err != nil || md.Output().Fields().ByName("meta").Message().FullName() != "kernrpc.reflecttest.v1.Note.Meta" {
		t.Fatalf("FindMethod(Split): %v, %v", md, err)
	}
}

// writeFile writes b into a file of its own and returns its path.
func writeFile(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "set.protoset")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBadDescriptorSets(t *testing.T) {
	good, err := os.ReadFile(gatewaySet)
	if err != nil {
		t.Fatal(err)
	}
	// The set without the well-known file it imports, as protoc writes it
	// without --include_imports.
	set := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(good, set); err != nil {
		t.Fatal(err)
	}
	var withoutImports descriptorpb.FileDescriptorSet
	for _, f := range set.File {
		if f.GetName() == "gateway.proto" {
			withoutImports.File = append(withoutImports.File, f)
		}
	}
	noImports, err := proto.Marshal(&withoutImports)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		path  string
		wants []string
	}{
		{"not a descriptor set", writeFile(t, []byte("service: echo\naddress: 127.0.0.1:0\n")), []string{"not a serialized FileDescriptorSet", "--descriptor_set_out"}},
		{"empty", writeFile(t, nil), []string{"holds no file"}},
		{"written without --include_imports", writeFile(t, noImports), []string{"google/protobuf/duration.proto", "--include_imports"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := generic.LoadDescriptorSet(tc.path)
			if !errors.Is(err, generic.ErrBadDescriptorSet) {
				t.Fatalf("LoadDescriptorSet: %v, want ErrBadDescriptorSet", err)
			}
			for _, w := range append(tc.wants, tc.path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if _, err := generic.LoadDescriptorSet(filepath.Join(t.TempDir(), "missing.protoset")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v, want os.ErrNotExist", err)
	}
	if _, err := generic.ParseDescriptorSet([]byte{0xff}); !errors.Is(err, generic.ErrBadDescriptorSet) {
		t.Errorf("ParseDescriptorSet of garbage: %v, want ErrBadDescriptorSet", err)
	}
}

func TestFindMethodErrors(t *testing.T) {
	src, err := generic.LoadDescriptorSet(notesSet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method string
		is     error
		wants  []string
	}{
		{"kernrpc.reflecttest.v1.Nope.Echo", generic.ErrUnknownService, []string{`"kernrpc.reflecttest.v1.Nope"`, "known: kernrpc.reflecttest.v1.Notes"}},
		{notes + "Nope", generic.ErrUnknownMethod, []string{"has Echo, Split, Join, Chat"}},
		{"kernrpc.reflecttest.v1.Note.text", generic.ErrUnknownService, []string{"is a message, not a service"}},
		{"Echo", generic.ErrUnknownMethod, []string{"want SERVICE.METHOD"}},
		{"Notes.", generic.ErrUnknownMethod, []string{"want SERVICE.METHOD"}},
	} {
		_, err := generic.FindMethod(context.Background(), src, tc.method)
		if !errors.Is(err, tc.is) {
			t.Errorf("FindMethod(%q): %v, want %v", tc.method, err, tc.is)
			continue
		}
		for _, w := range tc.wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("FindMethod(%q): %q does not mention %q", tc.method, err, w)
			}
		}
	}
	if _, err := src.FindDescriptor(context.Background(), protoreflect.FullName("no.Such")); !errors.Is(err, generic.ErrNotFound) {
		t.Errorf("FindDescriptor(no.Such): %v, want ErrNotFound", err)
	}
}

func TestKindNames(t *testing.T) {
	for k, want := range map[generic.Kind]string{generic.Unary: "unary", generic.ClientStreaming: "client-streaming",
		generic.ServerStreaming: "server-streaming", generic.BidiStreaming: "bidi-streaming", 9: "Kind(9)"} {
		if k.String() != want {
			t.Errorf("Kind %d is %q, want %q", k, k.String(), want)
		}
	}
}

// A leading dot, as .proto files write full names, names the same method.
func TestFindMethodTakesALeadingDot(t *testing.T) {
	src, err := generic.LoadDescriptorSet(notesSet)
	if err != nil {
		t.Fatal(err)
	}
	md, err := generic.FindMethod(context.Background(), src, "."+notes+"Split")
	if err != nil || md.FullName() != notes+"Split" {
		t.Fatalf("FindMethod(.%sSplit) = %v, %v", notes, md, err)
	}
}
