package protobuf

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc/internal/plainpb"
)

// The codec calls protobuf-go's generated methods itself (fastpath.go):
// what it encodes, and what it refuses, must be what the proto package
// does with the same messages.
func TestFastPathMatchesTheProtoPackage(t *testing.T) {
	dyn := dynamicpb.NewMessage((&plainpb.Echo{}).ProtoReflect().Descriptor())
	dyn.Set(dyn.Descriptor().Fields().ByName("text"), protoreflect.ValueOfString("dynamic"))
	for _, tc := range []struct {
		name string
		m    proto.Message
	}{
		{"plain", &plainpb.Echo{Payload: []byte("abc"), Text: "héllo"}},
		{"empty", &plainpb.Echo{}},
		{"nil pointer", (*plainpb.Echo)(nil)},
		{"nested", nestedFile()},
		{"dynamicpb, which has no fast path", dyn},
		{"invalid UTF-8", &plainpb.Echo{Text: "\xff"}},
		{"required field unset", &descriptorpb.UninterpretedOption_NamePart{}},
		{"required fields set", &descriptorpb.UninterpretedOption_NamePart{NamePart: proto.String("a"), IsExtension: proto.Bool(false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, wantErr := proto.Marshal(tc.m)
			if got := sizeOf(tc.m); wantErr == nil && got != len(want) {
				t.Errorf("sizeOf = %d, proto.Marshal wrote %d bytes", got, len(want))
			}
			for _, cached := range []bool{false, true} {
				if cached {
					sizeOf(tc.m)
				}
				got, err := marshalAppend([]byte("hdr"), tc.m, cached)
				if (err != nil) != (wantErr != nil) {
					t.Fatalf("marshalAppend(cached %v) error %v; proto.Marshal's %v", cached, err, wantErr)
				}
				if err == nil && !bytes.Equal(got, append([]byte("hdr"), want...)) {
					t.Errorf("marshalAppend(cached %v) = %x, want hdr then proto.Marshal's %x", cached, got, want)
				}
			}
		})
	}
}

func TestFastPathDecodesAsTheProtoPackage(t *testing.T) {
	valid, _ := proto.Marshal(&plainpb.Echo{Payload: []byte("abc"), Text: "x"})
	badUTF8 := []byte{0x12, 0x01, 0xff} // text (field 2) = "\xff"
	for _, tc := range []struct {
		name string
		data []byte
		into func() proto.Message
	}{
		{"plain", valid, func() proto.Message { return new(plainpb.Echo) }},
		{"cut short", valid[:len(valid)-1], func() proto.Message { return new(plainpb.Echo) }},
		{"invalid UTF-8", badUTF8, func() proto.Message { return new(plainpb.Echo) }},
		{"required field missing", nil, func() proto.Message { return new(descriptorpb.UninterpretedOption_NamePart) }},
		{"dynamicpb", valid, func() proto.Message {
			return dynamicpb.NewMessage((&plainpb.Echo{}).ProtoReflect().Descriptor())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, got := tc.into(), tc.into()
			wantErr := proto.UnmarshalOptions{Merge: true}.Unmarshal(tc.data, want)
			err := unmarshalMerge(tc.data, got)
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("unmarshalMerge error %v; proto.Unmarshal's %v", err, wantErr)
			}
			if err == nil && !proto.Equal(got, want) {
				t.Errorf("unmarshalMerge decoded %v, proto.Unmarshal %v", got, want)
			}
		})
	}
}

// BenchmarkFastPath compares the proto package's calls with the codec's
// direct calls of the same methods, for a 16 B message.
func BenchmarkFastPath(b *testing.B) {
	m := &plainpb.Echo{Payload: make([]byte, 16)}
	buf := make([]byte, 0, 64)
	data, _ := proto.Marshal(m)
	b.Run("encode/proto", func(b *testing.B) {
		for b.Loop() {
			_ = proto.Size(m)
			_, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, m)
		}
	})
	b.Run("encode/direct", func(b *testing.B) {
		for b.Loop() {
			_ = sizeOf(m)
			_, _ = marshalAppend(buf, m, true)
		}
	})
	b.Run("decode/proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = proto.UnmarshalOptions{Merge: true}.Unmarshal(data, new(plainpb.Echo))
		}
	})
	b.Run("decode/direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = unmarshalMerge(data, new(plainpb.Echo))
		}
	})
}
