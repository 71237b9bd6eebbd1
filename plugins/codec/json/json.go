// Package json is the JSON codec, for debugging and for clients in any
// language: protobuf messages go through protojson (the canonical JSON
// mapping of protobuf, with the lowerCamelCase field names protojson emits
// by default), every other Go value through encoding/json (field names from
// `json` struct tags).
//
// Config name: "json".
//
//	codec:
//	  name: json
//	  options:
//	    discard_unknown: false   # true: ignore fields the message does not have
//
// By default a field the target type does not have is an error, so that a
// misspelt field name fails loudly instead of arriving as a zero value.
// Decoded values do not alias the input.
package json

import (
	"bytes"
	encjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the codec's config name.
const Name = "json"

// Options configures the codec.
type Options struct {
	// DiscardUnknown ignores fields of the input that the target type does
	// not have, instead of failing. Turn it on when peers may run a newer
	// schema than this side.
	DiscardUnknown bool `json:"discard_unknown"`
}

// DefaultOptions returns the options a config that names the codec without
// options gets: unknown fields are errors.
func DefaultOptions() *Options { return &Options{} }

// Factory builds the codec; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"JSON: protobuf messages via protojson, other Go values via encoding/json",
	DefaultOptions, New)

func init() { kernel.RegisterCodec(Factory) }

// New builds the codec from o.
func New(o *Options) (kernel.Codec, error) {
	c := &Codec{
		discardUnknown: o.DiscardUnknown,
		unmarshalProto: protojson.UnmarshalOptions{DiscardUnknown: o.DiscardUnknown},
	}
	c.encoders.New = func() any {
		e := &encoder{}
		e.enc = encjson.NewEncoder(&e.w)
		// Nobody renders these bytes as HTML; escaping <, > and & would
		// only make them longer.
		e.enc.SetEscapeHTML(false)
		return e
	}
	return c, nil
}

// Codec is the JSON codec; build it with New. It is safe for concurrent use.
type Codec struct {
	discardUnknown bool
	marshalProto   protojson.MarshalOptions
	unmarshalProto protojson.UnmarshalOptions
	encoders       sync.Pool // *encoder
}

var _ kernel.Codec = (*Codec)(nil)

// encoder is an encoding/json Encoder writing straight into the caller's
// dst, pooled so that Marshal allocates no result slice of its own.
type encoder struct {
	enc *encjson.Encoder
	w   appendWriter
}

// appendWriter appends what is written to b.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// ErrTrailingData is wrapped by the error for input that holds more than one
// JSON value.
var ErrTrailingData = errors.New("data after the JSON value")

// Name returns "json".
func (*Codec) Name() string { return Name }

// Marshal appends the JSON encoding of v to dst.
func (c *Codec) Marshal(dst []byte, v any) ([]byte, error) {
	if m, ok := v.(proto.Message); ok {
		out, err := c.marshalProto.MarshalAppend(dst, m)
		if err != nil {
			return dst, fmt.Errorf("json: marshal %T with protojson: %w", v, err)
		}
		return out, nil
	}
	e := c.encoders.Get().(*encoder)
	e.w.b = dst
	err := e.enc.Encode(v)
	out := e.w.b
	e.w.b = nil // the pool must not keep the caller's buffer
	c.encoders.Put(e)
	if err != nil {
		return dst, fmt.Errorf("json: marshal %T: %w", v, err)
	}
	// Encode ends the value with a newline, which is not part of it.
	return out[:len(out)-1], nil
}

// Unmarshal decodes data into v, a non-nil pointer. v is reset first, so a
// reused value keeps nothing from its previous contents.
func (c *Codec) Unmarshal(data []byte, v any) error {
	if m, ok := v.(proto.Message); ok {
		if !m.ProtoReflect().IsValid() {
			return fmt.Errorf("json: cannot unmarshal into a nil %T; pass a pointer to a message, e.g. new(T)", v)
		}
		if err := c.unmarshalProto.Unmarshal(data, m); err != nil {
			return fmt.Errorf("json: unmarshal %d bytes into %T with protojson: %w%s", len(data), v, err, c.hint(err))
		}
		return nil
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("json: cannot unmarshal into %T; pass a non-nil pointer", v)
	}
	// encoding/json merges into what v holds; the kernel's contract, like
	// proto.Unmarshal, is to replace it.
	rv.Elem().SetZero()
	if err := c.decode(data, v); err != nil {
		return fmt.Errorf("json: unmarshal %d bytes into %T: %w%s", len(data), v, err, c.hint(err))
	}
	return nil
}

// hint says how to accept a message with fields this side does not know.
func (c *Codec) hint(err error) string {
	if !c.discardUnknown && strings.Contains(err.Error(), "unknown field") {
		return " (set the json codec's option discard_unknown to ignore fields this side does not know)"
	}
	return ""
}

func (c *Codec) decode(data []byte, v any) error {
	if c.discardUnknown {
		return encjson.Unmarshal(data, v)
	}
	// Only a Decoder can refuse unknown fields; unlike Unmarshal it stops
	// after one value, so what follows is checked here.
	dec := encjson.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w at byte %d", ErrTrailingData, dec.InputOffset())
	}
	return nil
}
