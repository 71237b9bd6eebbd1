package protobuf

import (
	"fmt"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// vtFacts is what decoding through vtprotobuf's methods needs to know about
// a message type, worked out once from its descriptor.
type vtFacts struct {
	// plainReset is set when the type, or one it holds, has a bytes field
	// with presence (proto3 optional, proto2 optional). ResetVT keeps such
	// a field's memory as an empty non-nil slice, which reads as set, and
	// returns sub-messages to vtprotobuf's pool in that state: decoding
	// after it would leave the field present in a message that did not
	// carry it. Such types are reset with proto.Reset instead.
	plainReset bool
	// nested are the type's fields that hold messages (singular, repeated,
	// and maps, whose entries are messages whatever their values):
	// checkUnknown reads into them.
	nested []nestedField
}

// nestedField is a field that holds messages of type md.
type nestedField struct {
	num   protowire.Number
	md    protoreflect.MessageDescriptor
	entry bool // md is a map's entry type
}

// typeFacts remembers the vtFacts of each message type a codec decodes.
// A nil *typeFacts is the zero Codec's: it remembers nothing, so its
// lookups return nil, and the functions taking a nil *vtFacts look at the
// type's own fields instead, without allocating.
type typeFacts struct{ m sync.Map } // protoreflect.MessageDescriptor → *vtFacts

func (t *typeFacts) lookup(md protoreflect.MessageDescriptor) *vtFacts {
	if t == nil {
		return nil
	}
	if f, ok := t.m.Load(md); ok {
		return f.(*vtFacts)
	}
	f, _ := t.m.LoadOrStore(md, factsOf(md))
	return f.(*vtFacts)
}

func factsOf(md protoreflect.MessageDescriptor) *vtFacts {
	f := &vtFacts{plainReset: holdsBytesWithPresence(md, map[protoreflect.FullName]bool{})}
	fields := md.Fields()
	for i := range fields.Len() {
		if nf, ok := nestedOf(fields.Get(i)); ok {
			f.nested = append(f.nested, nf)
		}
	}
	return f
}

// nestedOf describes fd if it holds messages: a map's entries are
// messages too, whatever its values, and are read for checkEntryField.
func nestedOf(fd protoreflect.FieldDescriptor) (nestedField, bool) {
	if !fd.IsMap() && fd.Message() == nil {
		return nestedField{}, false
	}
	return nestedField{num: fd.Number(), md: fd.Message(), entry: fd.IsMap()}, true
}

// field returns the field numbered num if it holds messages.
func (f *vtFacts) field(md protoreflect.MessageDescriptor, num protowire.Number) (nestedField, bool) {
	if f == nil {
		if fd := md.Fields().ByNumber(num); fd != nil {
			return nestedOf(fd)
		}
		return nestedField{}, false
	}
	for _, nf := range f.nested {
		if nf.num == num {
			return nf, true
		}
	}
	return nestedField{}, false
}

// holdsMessages reports whether md, whose facts are f, has fields that
// hold messages, maps included.
func holdsMessages(f *vtFacts, md protoreflect.MessageDescriptor) bool {
	if f != nil {
		return len(f.nested) > 0
	}
	fields := md.Fields()
	for i := range fields.Len() {
		if _, ok := nestedOf(fields.Get(i)); ok {
			return true
		}
	}
	return false
}

// resetPlainly reports whether md's messages, whose facts are f, must be
// reset with proto.Reset rather than ResetVT. Without facts, any type
// that holds messages is, since finding presence in them would take
// memory to break the cycles of recursive types.
func resetPlainly(f *vtFacts, md protoreflect.MessageDescriptor) bool {
	if f != nil {
		return f.plainReset
	}
	fields := md.Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); messageValue(fd) != nil || hasBytesPresence(fd) {
			return true
		}
	}
	return false
}

// messageValue returns the type of the messages fd holds, nil if none.
func messageValue(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		return fd.MapValue().Message()
	}
	return fd.Message()
}

// hasBytesPresence reports whether fd is a bytes field whose presence
// ResetVT keeps: not one of a real oneof, which ResetVT clears (proto3
// optional is a oneof of one, synthetic).
func hasBytesPresence(fd protoreflect.FieldDescriptor) bool {
	if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() {
		return false
	}
	return fd.Kind() == protoreflect.BytesKind && fd.HasPresence() && !fd.IsList()
}

// holdsBytesWithPresence reports whether md or a type it holds, at any
// depth, has a bytes field with presence. seen breaks recursive types.
func holdsBytesWithPresence(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if hasBytesPresence(fd) {
			return true
		}
		if sub := messageValue(fd); sub != nil && holdsBytesWithPresence(sub, seen) {
			return true
		}
	}
	return false
}

// checkUnknown checks data, which vtprotobuf's decoder has just decoded
// into m, for what protobuf-go would have refused: vtprotobuf's decoders
// keep malformed groups and field numbers out of range as unknown fields,
// and nest without limit, and such bytes would fail later, far from their
// cause (printing the message panics; re-encoding sends them on). A
// message that holds no messages has its unknown fields parsed; any other
// has data read once more, into every message it holds, which costs less
// than reaching those messages by reflection. f is m's facts, or nil.
func (t *typeFacts) checkUnknown(data []byte, m protoreflect.Message, f *vtFacts) error {
	md := m.Descriptor()
	if !holdsMessages(f, md) {
		return parseUnknown(m.GetUnknown())
	}
	return t.scan(data, md, f, levelsBelowTop)
}

// levelsBelowTop is how deep messages may nest under the one decoded:
// protobuf-go's recursion limit counts that one too.
const levelsBelowTop = protowire.DefaultRecursionLimit - 1

// scan reads b, a message of type md whose facts are f, under which depth
// more levels may nest, and the messages it holds.
func (t *typeFacts) scan(b []byte, md protoreflect.MessageDescriptor, f *vtFacts, depth int) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("in %s: %w", md.FullName(), protowire.ParseError(n))
		}
		if !num.IsValid() {
			return fmt.Errorf("in %s: unknown fields: field number %d is out of range", md.FullName(), num)
		}
		b = b[n:]
		if md.IsMapEntry() {
			if err := checkEntryField(md, num, typ); err != nil {
				return err
			}
		}
		if nf, ok := f.field(md, num); ok && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("in %s: %w", md.FullName(), protowire.ParseError(n))
			}
			below := depth - 1
			if nf.entry { // an entry is not a level of its own: its value is
				below = depth
			} else if depth == 0 {
				return fmt.Errorf("messages nested more than %d deep exceed protobuf's maximum recursion depth", protowire.DefaultRecursionLimit)
			}
			if err := t.scan(v, nf.md, t.lookup(nf.md), below); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return fmt.Errorf("in %s: %w", md.FullName(), protowire.ParseError(n))
		}
		b = b[n:]
	}
	return nil
}

// checkEntryField refuses a map entry's key or value sent with another
// wire type than its kind's. vtprotobuf refuses that of an ordinary field,
// but reads an entry's key and value whatever their wire type says (a
// varint key's tag read as a string's length), decoding another key than
// the one sent, where protobuf-go skips such a field.
func checkEntryField(md protoreflect.MessageDescriptor, num protowire.Number, typ protowire.Type) error {
	fd := md.Fields().ByNumber(num)
	if fd == nil {
		return nil
	}
	if want := wireType(fd.Kind()); typ != want {
		return fmt.Errorf("in %s: field %s has wire type %d, want %d", md.FullName(), fd.Name(), typ, want)
	}
	return nil
}

// wireType is the wire type a field of kind k is encoded with (a packed
// list aside, which no map entry holds).
func wireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	default: // bool, enum and the varint integers
		return protowire.VarintType
	}
}

func parseUnknown(b []byte) error {
	for len(b) > 0 {
		num, _, n := protowire.ConsumeField(b)
		if n < 0 {
			return fmt.Errorf("unknown fields: %w", protowire.ParseError(n))
		}
		if !num.IsValid() {
			return fmt.Errorf("unknown fields: field number %d is out of range", num)
		}
		b = b[n:]
	}
	return nil
}
