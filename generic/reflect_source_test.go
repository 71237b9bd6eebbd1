package generic_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/internal/reflectpb"
	"github.com/kernrpc/kernrpc/kernel"
)

// fileProto is a file of package bad.v1 declaring message msg, importing
// imports.
func fileProto(t *testing.T, name, msg string, imports ...string) []byte {
	t.Helper()
	b, err := proto.Marshal(&descriptorpb.FileDescriptorProto{
		Name: proto.String(name), Package: proto.String("bad.v1"), Syntax: proto.String("proto3"),
		Dependency:  imports,
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String(msg)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A server whose reflection answers are wrong (files that do not decode,
// imports it never sends, files without the symbol asked for, a failed
// listing) gives the client an error naming what was asked and what was
// wrong; a file that did not resolve is not kept, so a later good answer
// is used.
func TestReflectionSourceRefusesBadAnswers(t *testing.T) {
	cfg := config(t, "protobuf", false)
	answers := map[string][][]byte{
		"bad.v1.Garbled":    {[]byte("\xff\xff not a descriptor")},
		"bad.v1.Orphan":     {fileProto(t, "orphan.proto", "Orphan", "missing.proto")},
		"bad.v1.Elsewhere":  {fileProto(t, "other.proto", "Other")},
		"bad.v1.OrphanFine": {fileProto(t, "orphan.proto", "OrphanFine")},
		"bad.v1.Half":       {fileProto(t, "half.proto", "Half"), []byte("\xff\xff not a descriptor")},
		"bad.v1.HalfFine":   {fileProto(t, "half.proto", "Half"), fileProto(t, "fine.proto", "HalfFine", "half.proto")},
		"bad.v1.Cycle":      {fileProto(t, "c1.proto", "Cycle", "c2.proto"), fileProto(t, "c2.proto", "C2", "c1.proto")},
		"bad.v1.Dup":        {fileProto(t, "dup.proto", "Half")},
	}
	serveNotes(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, kernrpc.ReflectionFileContainingMethod, func(_ context.Context, req *reflectpb.FileContainingRequest) (*reflectpb.FileContainingResponse, error) {
			return &reflectpb.FileContainingResponse{FileDescriptorProtos: answers[req.Symbol]}, nil
		})
		kernrpc.Handle(s, kernrpc.ReflectionListServicesMethod, func(context.Context, *reflectpb.ListServicesRequest) (*reflectpb.ListServicesResponse, error) {
			return nil, kernel.Errorf(kernel.Internal, "listing broke")
		})
	})
	src := generic.NewReflectionSource(newClient(t, cfg))
	ctx := context.Background()
	for _, tc := range []struct {
		symbol string
		is     error
		want   string
	}{
		{"bad.v1.Garbled", nil, `file containing "bad.v1.Garbled": the server sent a file descriptor that does not decode`},
		{"bad.v1.Orphan", nil, `file containing "bad.v1.Orphan": the files the server sent do not resolve`},
		{"bad.v1.Half", nil, `file containing "bad.v1.Half": the server sent a file descriptor that does not decode`},
		{"bad.v1.Cycle", nil, `file containing "bad.v1.Cycle": the files the server sent do not resolve: import cycle`},
		{"bad.v1.Elsewhere", generic.ErrNotFound, `"bad.v1.Elsewhere": not found in the files the server sent for it`},
	} {
		_, err := src.FindDescriptor(ctx, protoreflect.FullName(tc.symbol))
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("FindDescriptor(%s): %v; want %q", tc.symbol, err, tc.want)
		}
	}
	// orphan.proto did not resolve, so it was not kept: this answer, a
	// file of that name that resolves, is taken.
	if d, err := src.FindDescriptor(ctx, "bad.v1.OrphanFine"); err != nil || d.FullName() != "bad.v1.OrphanFine" {
		t.Errorf("FindDescriptor after a file that did not resolve: %v, %v", d, err)
	}
	// Nor was half.proto, from an answer whose other file did not decode:
	// sent again, it resolves.
	if d, err := src.FindDescriptor(ctx, "bad.v1.Half"); err == nil {
		t.Errorf("FindDescriptor(bad.v1.Half) found %v from an answer that failed", d.FullName())
	}
	if d, err := src.FindDescriptor(ctx, "bad.v1.HalfFine"); err != nil || d.FullName() != "bad.v1.HalfFine" {
		t.Errorf("FindDescriptor after an answer that half decoded: %v, %v", d, err)
	}
	if d, err := src.FindDescriptor(ctx, "bad.v1.Half"); err != nil || d.FullName() != "bad.v1.Half" {
		t.Errorf("FindDescriptor(bad.v1.Half) once half.proto came in a good answer: %v, %v", d, err)
	}
	// A file declaring a name a file sent before declares is refused.
	if _, err := src.FindDescriptor(ctx, "bad.v1.Dup"); err == nil || !strings.Contains(err.Error(), "do not resolve") {
		t.Errorf("FindDescriptor(bad.v1.Dup), a file declaring bad.v1.Half again: %v", err)
	}
	if _, err := src.Services(ctx); err == nil || !strings.Contains(err.Error(), "generic: reflection: list services: ") || !strings.Contains(err.Error(), "listing broke") {
		t.Errorf("Services from a server whose listing fails: %v", err)
	}
}

// A descriptor the reflection source gave stays the one it gives for that
// name once later answers brought other files: a dynamicpb message built
// from the first takes the fields of the second (dynamicpb tells fields
// apart by descriptor, not by name).
func TestReflectionSourceDescriptorsStayTheSame(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	src, ctx := g.Source(), context.Background()
	md, err := g.Method(ctx, notes+"Echo")
	if err != nil {
		t.Fatal(err)
	}
	// Another file: the reflection service's own.
	if _, err := src.FindDescriptor(ctx, kernrpc.ReflectionService); err != nil {
		t.Fatal(err)
	}
	d, err := src.FindDescriptor(ctx, "kernrpc.reflecttest.v1.Note")
	if err != nil {
		t.Fatal(err)
	}
	if d != md.Input() {
		t.Errorf("Note after another file came in is a new descriptor")
	}
	req := dynamicpb.NewMessage(md.Input())
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("setting a field found later on a request of the method found first: %v", p)
			}
		}()
		req.Set(d.(protoreflect.MessageDescriptor).Fields().ByName("text"), protoreflect.ValueOfString("hi"))
	}()
}
