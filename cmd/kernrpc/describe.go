package main

import (
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kernrpc/kernrpc/generic"
)

// printDescriptor writes d in .proto syntax, after a line saying what it
// is and where it is defined. A method comes with its request and
// response messages, so that one describe shows what to send.
func printDescriptor(w io.Writer, d protoreflect.Descriptor) error {
	p := &protoPrinter{}
	switch d := d.(type) {
	case protoreflect.ServiceDescriptor:
		p.linef(0, "// %s is a service (%s)", d.FullName(), d.ParentFile().Path())
		p.service(d)
	case protoreflect.MethodDescriptor:
		p.linef(0, "// %s is a %s method of %s (%s)", d.FullName(), generic.KindOf(d), d.Parent().FullName(), d.ParentFile().Path())
		p.method(0, d)
		msgs := []protoreflect.MessageDescriptor{d.Input()}
		if d.Output().FullName() != d.Input().FullName() {
			msgs = append(msgs, d.Output())
		}
		for _, m := range msgs {
			p.linef(0, "")
			p.linef(0, "// %s (%s)", m.FullName(), m.ParentFile().Path())
			p.message(0, m)
		}
	case protoreflect.MessageDescriptor:
		p.linef(0, "// %s is a message (%s)", d.FullName(), d.ParentFile().Path())
		p.message(0, d)
	case protoreflect.EnumDescriptor:
		p.linef(0, "// %s is an enum (%s)", d.FullName(), d.ParentFile().Path())
		p.enum(0, d)
	case protoreflect.FieldDescriptor:
		p.linef(0, "// %s is a field of %s (%s)", d.FullName(), d.ContainingMessage().FullName(), d.ParentFile().Path())
		p.field(0, d)
	default:
		p.linef(0, "// %s (%s)", d.FullName(), d.ParentFile().Path())
	}
	_, err := io.WriteString(w, p.b.String())
	return err
}

// protoPrinter writes descriptors back as .proto declarations, with the
// comments the descriptors carry (a descriptor set written with
// --include_source_info has them; generated code's do not).
type protoPrinter struct{ b strings.Builder }

func (p *protoPrinter) linef(depth int, format string, args ...any) {
	if format != "" {
		p.b.WriteString(strings.Repeat("  ", depth))
		fmt.Fprintf(&p.b, format, args...)
	}
	p.b.WriteByte('\n')
}

func (p *protoPrinter) comments(depth int, d protoreflect.Descriptor) {
	loc := d.ParentFile().SourceLocations().ByDescriptor(d)
	for _, l := range strings.Split(strings.TrimRight(loc.LeadingComments, "\n"), "\n") {
		if l != "" {
			p.linef(depth, "//%s", l)
		}
	}
}

func (p *protoPrinter) service(sd protoreflect.ServiceDescriptor) {
	p.comments(0, sd)
	p.linef(0, "service %s {", sd.Name())
	p.optionLines(1, sd)
	for i := range sd.Methods().Len() {
		p.method(1, sd.Methods().Get(i))
	}
	p.linef(0, "}")
}

func (p *protoPrinter) method(depth int, md protoreflect.MethodDescriptor) {
	p.comments(depth, md)
	stream := func(on bool) string {
		if on {
			return "stream "
		}
		return ""
	}
	sig := fmt.Sprintf("rpc %s(%s.%s) returns (%s.%s)", md.Name(),
		stream(md.IsStreamingClient()), md.Input().FullName(), stream(md.IsStreamingServer()), md.Output().FullName())
	var opts protoPrinter
	opts.optionLines(depth+1, md)
	if opts.b.Len() == 0 {
		p.linef(depth, "%s;", sig)
		return
	}
	p.linef(depth, "%s {", sig)
	p.b.WriteString(opts.b.String())
	p.linef(depth, "}")
}

func (p *protoPrinter) message(depth int, m protoreflect.MessageDescriptor) {
	p.comments(depth, m)
	p.linef(depth, "message %s {", m.Name())
	p.optionLines(depth+1, m)
	for i := range m.Enums().Len() {
		p.enum(depth+1, m.Enums().Get(i))
	}
	for i := range m.Messages().Len() {
		if nested := m.Messages().Get(i); !nested.IsMapEntry() {
			p.message(depth+1, nested)
		}
	}
	inOneof := map[protoreflect.Name]bool{}
	for i := range m.Oneofs().Len() {
		o := m.Oneofs().Get(i)
		if o.IsSynthetic() {
			continue
		}
		p.linef(depth+1, "oneof %s {", o.Name())
		for j := range o.Fields().Len() {
			f := o.Fields().Get(j)
			inOneof[f.Name()] = true
			p.field(depth+2, f)
		}
		p.linef(depth+1, "}")
	}
	for i := range m.Fields().Len() {
		if f := m.Fields().Get(i); !inOneof[f.Name()] {
			p.field(depth+1, f)
		}
	}
	p.extensionRanges(depth+1, m)
	p.reserved(depth+1, fieldRanges(m.ReservedRanges()), true, maxFieldNumber, m.ReservedNames())
	p.linef(depth, "}")
}

func (p *protoPrinter) field(depth int, f protoreflect.FieldDescriptor) {
	p.comments(depth, f)
	label := ""
	switch {
	case f.IsMap():
	case f.Cardinality() == protoreflect.Repeated:
		label = "repeated "
	case f.HasOptionalKeyword():
		label = "optional "
	case f.Cardinality() == protoreflect.Required:
		label = "required "
	}
	typ := typeName(f)
	if f.IsMap() {
		typ = fmt.Sprintf("map<%s, %s>", typeName(f.MapKey()), typeName(f.MapValue()))
	}
	p.linef(depth, "%s%s %s = %d%s;", label, typ, f.Name(), f.Number(), fieldOptions(f))
}

func typeName(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return "." + string(f.Message().FullName())
	case protoreflect.EnumKind:
		return "." + string(f.Enum().FullName())
	}
	return f.Kind().String()
}

func (p *protoPrinter) enum(depth int, e protoreflect.EnumDescriptor) {
	p.comments(depth, e)
	p.linef(depth, "enum %s {", e.Name())
	p.optionLines(depth+1, e)
	for i := range e.Values().Len() {
		v := e.Values().Get(i)
		p.comments(depth+1, v)
		p.linef(depth+1, "%s = %d%s;", v.Name(), v.Number(), enumValueOptions(v))
	}
	p.reserved(depth+1, enumRanges(e.ReservedRanges()), false, maxEnumNumber, e.ReservedNames())
	p.linef(depth, "}")
}
