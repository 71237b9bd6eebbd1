package main

import (
	"math"
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// What describe writes beyond names and numbers: the parts of a
// declaration that change what a caller sends or gets back (a proto2
// default, a JSON name call's JSON must use, numbers and names a message
// reserves) and the standard options a caller acts on (deprecated,
// idempotency_level). Custom options are left out: printing them needs
// their extension's declaration.

// fieldOptions is the bracketed option list after a field's number, or "".
func fieldOptions(f protoreflect.FieldDescriptor) string {
	var opts []string
	if f.HasDefault() {
		opts = append(opts, "default = "+defaultLiteral(f))
	}
	// protoc fills json_name in every descriptor it writes: only one
	// that differs from the name's own camel case was written in .proto.
	if f.HasJSONName() && f.JSONName() != jsonCamelCase(string(f.Name())) {
		opts = append(opts, "json_name = "+quoteProto([]byte(f.JSONName())))
	}
	if o, ok := f.Options().(*descriptorpb.FieldOptions); ok && o != nil {
		if o.Packed != nil && f.ParentFile().Syntax() != protoreflect.Editions {
			opts = append(opts, "packed = "+strconv.FormatBool(o.GetPacked()))
		}
		if o.GetDeprecated() {
			opts = append(opts, "deprecated = true")
		}
	}
	if len(opts) == 0 {
		return ""
	}
	return " [" + strings.Join(opts, ", ") + "]"
}

// defaultLiteral writes f's default as .proto spells it.
func defaultLiteral(f protoreflect.FieldDescriptor) string {
	v := f.Default()
	switch f.Kind() {
	case protoreflect.EnumKind:
		return string(f.DefaultEnumValue().Name())
	case protoreflect.StringKind:
		return quoteProto([]byte(v.String()))
	case protoreflect.BytesKind:
		return quoteProto(v.Bytes())
	case protoreflect.BoolKind:
		return strconv.FormatBool(v.Bool())
	case protoreflect.FloatKind:
		return floatLiteral(v.Float(), 32)
	case protoreflect.DoubleKind:
		return floatLiteral(v.Float(), 64)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.FormatUint(v.Uint(), 10)
	}
	return strconv.FormatInt(v.Int(), 10)
}

func floatLiteral(x float64, bits int) string {
	switch {
	case math.IsInf(x, 1):
		return "inf"
	case math.IsInf(x, -1):
		return "-inf"
	case math.IsNaN(x):
		return "nan"
	}
	return strconv.FormatFloat(x, 'g', -1, bits)
}

// quoteProto writes b as a .proto string literal: printable ASCII as it
// is, every other byte as an octal escape, which protoc reads back into
// the same bytes (UTF-8 included).
func quoteProto(b []byte) string {
	var s strings.Builder
	s.WriteByte('"')
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			s.WriteByte('\\')
			s.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			s.WriteByte(c)
		default:
			s.WriteByte('\\')
			s.WriteString(strconv.FormatUint(uint64(c)>>6, 8))
			s.WriteString(strconv.FormatUint(uint64(c)>>3&7, 8))
			s.WriteString(strconv.FormatUint(uint64(c)&7, 8))
		}
	}
	s.WriteByte('"')
	return s.String()
}

// jsonCamelCase is the JSON name protoc gives a field that declares none.
func jsonCamelCase(name string) string {
	var b strings.Builder
	upper := false
	for _, c := range []byte(name) {
		switch {
		case c == '_':
			upper = true
		case upper && 'a' <= c && c <= 'z':
			b.WriteByte(c - 'a' + 'A')
			upper = false
		default:
			b.WriteByte(c)
			upper = false
		}
	}
	return b.String()
}

// reserved writes a message's or an enum's reserved numbers and names.
// end is exclusive for a message's ranges and inclusive for an enum's.
func (p *protoPrinter) reserved(depth int, ranges [][2]int32, exclusiveEnd bool, max int32, names protoreflect.Names) {
	if len(ranges) > 0 {
		parts := make([]string, len(ranges))
		for i, r := range ranges {
			end := r[1]
			if exclusiveEnd {
				end--
			}
			parts[i] = rangeText(r[0], end, max)
		}
		p.linef(depth, "reserved %s;", strings.Join(parts, ", "))
	}
	if names.Len() > 0 {
		parts := make([]string, names.Len())
		for i := range names.Len() {
			parts[i] = quoteProto([]byte(names.Get(i)))
		}
		p.linef(depth, "reserved %s;", strings.Join(parts, ", "))
	}
}

// extensionRanges writes a proto2 message's extension ranges.
func (p *protoPrinter) extensionRanges(depth int, m protoreflect.MessageDescriptor) {
	rs := m.ExtensionRanges()
	if rs.Len() == 0 {
		return
	}
	parts := make([]string, rs.Len())
	for i := range rs.Len() {
		r := rs.Get(i)
		parts[i] = rangeText(int32(r[0]), int32(r[1])-1, maxFieldNumber)
	}
	p.linef(depth, "extensions %s;", strings.Join(parts, ", "))
}

// The largest field number, and enum number, which .proto spells "max".
const (
	maxFieldNumber = 1<<29 - 1
	maxEnumNumber  = math.MaxInt32
)

// rangeText writes an inclusive range as .proto does.
func rangeText(start, end, max int32) string {
	switch {
	case start == end:
		return strconv.Itoa(int(start))
	case end == max:
		return strconv.Itoa(int(start)) + " to max"
	}
	return strconv.Itoa(int(start)) + " to " + strconv.Itoa(int(end))
}

func fieldRanges(rs protoreflect.FieldRanges) [][2]int32 {
	out := make([][2]int32, rs.Len())
	for i := range rs.Len() {
		r := rs.Get(i)
		out[i] = [2]int32{int32(r[0]), int32(r[1])}
	}
	return out
}

func enumRanges(rs protoreflect.EnumRanges) [][2]int32 {
	out := make([][2]int32, rs.Len())
	for i := range rs.Len() {
		r := rs.Get(i)
		out[i] = [2]int32{int32(r[0]), int32(r[1])}
	}
	return out
}

// deprecated reports whether d carries the standard option deprecated.
func deprecated(d protoreflect.Descriptor) bool {
	switch o := d.Options().(type) {
	case *descriptorpb.MessageOptions:
		return o.GetDeprecated()
	case *descriptorpb.EnumOptions:
		return o.GetDeprecated()
	case *descriptorpb.ServiceOptions:
		return o.GetDeprecated()
	case *descriptorpb.MethodOptions:
		return o.GetDeprecated()
	}
	return false
}

// optionLines writes the standard options of a message, enum, service or
// method that a caller acts on, as option statements inside its body.
func (p *protoPrinter) optionLines(depth int, d protoreflect.Descriptor) {
	if o, ok := d.Options().(*descriptorpb.EnumOptions); ok && o.GetAllowAlias() {
		p.linef(depth, "option allow_alias = true;") // without it, protoc refuses the aliases
	}
	if deprecated(d) {
		p.linef(depth, "option deprecated = true;")
	}
	if o, ok := d.Options().(*descriptorpb.MethodOptions); ok && o != nil && o.IdempotencyLevel != nil {
		p.linef(depth, "option idempotency_level = %s;", o.GetIdempotencyLevel())
	}
}

// enumValueOptions is the bracketed option list after an enum value's
// number, or "".
func enumValueOptions(v protoreflect.EnumValueDescriptor) string {
	if o, ok := v.Options().(*descriptorpb.EnumValueOptions); ok && o.GetDeprecated() {
		return " [deprecated = true]"
	}
	return ""
}
