package protobuf

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/plainpb"
)

// nestedFile is a message with messages inside messages: MarshalSized
// writes their lengths from the sizes Size cached in each.
func nestedFile() *descriptorpb.FileDescriptorProto {
	return &descriptorpb.FileDescriptorProto{
		Name:    proto.String("nested.proto"),
		Package: proto.String("kernrpc.test"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Outer"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("inner"), Number: proto.Int32(1), TypeName: proto.String(".kernrpc.test.Outer.Inner")},
			},
			NestedType: []*descriptorpb.DescriptorProto{{Name: proto.String(strings.Repeat("Inner", 40))}},
		}},
	}
}

func TestMarshalSizedEncodesAsMarshal(t *testing.T) {
	var c Codec
	for _, m := range []proto.Message{
		&plainpb.Echo{Text: "plain", Payload: bytes.Repeat([]byte{7}, 300)},
		&echopb.Echo{Text: "vt", Payload: []byte{1, 2}},
		wrapperspb.Bytes(nil),
		nestedFile(),
	} {
		want, err := c.Marshal([]byte("hdr"), m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.MarshalSized([]byte("hdr"), m, c.Size(m))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%T: MarshalSized = %x, %v; want Marshal's %x", m, got, err, want)
		}
	}
}

// A message changed between Size and MarshalSized, which only a caller
// racing with its own send can do, fails rather than going out with
// lengths that no longer match.
func TestMarshalSizedRefusesAMessageChangedSinceSize(t *testing.T) {
	var c Codec
	plain := &plainpb.Echo{Payload: []byte{1}}
	vt := &echopb.Echo{Payload: []byte{1}}
	nested := nestedFile()
	for _, tc := range []struct {
		msg    proto.Message
		change func()
	}{
		{plain, func() { plain.Payload = make([]byte, 200) }},
		{vt, func() { vt.Payload = nil }},
		{nested, func() { nested.MessageType[0].NestedType[0].Name = proto.String("I") }},
	} {
		size := c.Size(tc.msg)
		tc.change()
		out, err := c.MarshalSized([]byte("hdr"), tc.msg, size)
		// protobuf-go checks each nested message against its cached size.
		if err == nil || !strings.Contains(err.Error(), "changed while it was being sent") && !strings.Contains(err.Error(), "size mismatch") {
			t.Errorf("%T changed after Size: MarshalSized = %x, %v; want an error saying it changed", tc.msg, out, err)
		}
		if string(out) != "hdr" {
			t.Errorf("%T: the failed MarshalSized returned %q, want dst unchanged", tc.msg, out)
		}
	}
}

func TestUnmarshalFreshDecodesAsUnmarshal(t *testing.T) {
	var c Codec
	for _, tc := range []struct {
		in    proto.Message
		fresh func() proto.Message
	}{
		{&plainpb.Echo{Text: "plain", Payload: []byte{1, 2, 3}}, func() proto.Message { return new(plainpb.Echo) }},
		{&echopb.Echo{Text: "vt", Payload: []byte{4}}, func() proto.Message { return new(echopb.Echo) }},
		{nestedFile(), func() proto.Message { return new(descriptorpb.FileDescriptorProto) }},
	} {
		data, err := c.Marshal(nil, tc.in)
		if err != nil {
			t.Fatal(err)
		}
		got := tc.fresh()
		if err := c.UnmarshalFresh(data, got); err != nil || !proto.Equal(got, tc.in) {
			t.Errorf("UnmarshalFresh into %T = %v, %v; want %v", got, got, err, tc.in)
		}
		if err := c.UnmarshalFresh(data[:len(data)-1], tc.fresh()); err == nil {
			t.Errorf("UnmarshalFresh of a cut %T: want an error", tc.in)
		}
	}
	// vtprotobuf keeps malformed unknown fields that protobuf-go refuses.
	if err := c.UnmarshalFresh([]byte{0x03}, new(echopb.Echo)); err == nil {
		t.Errorf("UnmarshalFresh of a group start with no end into a vtprotobuf message: want an error")
	}
	if err := c.UnmarshalFresh(nil, new(string)); !errors.Is(err, ErrNotMessage) {
		t.Errorf("UnmarshalFresh into a *string = %v, want ErrNotMessage", err)
	}
}

func BenchmarkMarshalSized(b *testing.B) {
	var c Codec
	m := &plainpb.Echo{Payload: make([]byte, 16)}
	buf := make([]byte, 0, 64)
	b.Run("Size+Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = c.Marshal(buf, m)
			_ = c.Size(m)
		}
	})
	b.Run("Size+MarshalSized", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = c.MarshalSized(buf, m, c.Size(m))
		}
	})
}

func BenchmarkUnmarshalFresh(b *testing.B) {
	var c Codec
	data, _ := c.Marshal(nil, &plainpb.Echo{Payload: make([]byte, 16)})
	for _, bc := range []struct {
		name   string
		decode func([]byte, any) error
	}{{"Unmarshal", c.Unmarshal}, {"UnmarshalFresh", c.UnmarshalFresh}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.decode(data, new(plainpb.Echo)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// vtprotobuf's MarshalToSizedBufferVT indexes past the start of a buffer
// sized for a smaller message: a message grown since Size is an error.
func TestMarshalSizedRefusesAVTMessageGrownSinceSize(t *testing.T) {
	var c Codec
	m := &echopb.Echo{Payload: []byte{1}}
	size := c.Size(m)
	m.Text = "grown"
	out, err := c.MarshalSized([]byte("hdr"), m, size)
	if err == nil || !strings.Contains(err.Error(), "no longer fits") || string(out) != "hdr" {
		t.Errorf("MarshalSized of a grown message = %q, %v; want dst and an error saying it no longer fits", out, err)
	}
}
