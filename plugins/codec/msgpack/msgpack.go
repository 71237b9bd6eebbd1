// Package msgpack is the MessagePack codec, for plain Go structs that have
// no schema: fields travel by name, `msgpack:"name"` struct tags rename them
// (or `msgpack:"-"` leaves them out), as github.com/vmihailenco/msgpack/v5
// does. Any value that library encodes works, protobuf-generated structs
// included (by their exported fields), except that a field of an interface
// type with methods, such as a protobuf oneof, decodes only as nil: any
// other value for it is an error (use the protobuf or json codec for such
// messages).
//
// Config name: "msgpack".
//
//	codec:
//	  name: msgpack
//	  options:
//	    discard_unknown: false   # true: ignore fields the struct does not have
//
// By default a field the target struct does not have is an error, as in the
// json codec. Decoded values do not alias the input. Input is checked before
// the library decodes it: no length may claim more than the input holds,
// and arrays and maps nest at most 10000 deep, so what a peer's message
// makes the decoder allocate stays in proportion to its size. Input the
// library panics on (a key Go cannot hash, such as an array, decoded into
// a map keyed by interface{}; a value for an interface field with methods)
// is an error too.
//
// Integers decode as the library decodes them: a value too large for its
// field is cut to the field's width without an error (300 into an int8
// is 44, -1 into a uint32 is 4294967295), where the json codec refuses
// it. Sides that disagree on a field's width see different numbers: keep
// the struct types of both sides the same, or use a codec with a schema.
package msgpack

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the codec's config name.
const Name = "msgpack"

// Options configures the codec.
type Options struct {
	// DiscardUnknown ignores fields of the input that the target struct
	// does not have, instead of failing. Turn it on when peers may send
	// structs with more fields than this side's.
	DiscardUnknown bool `json:"discard_unknown"`
}

// DefaultOptions returns the options a config that names the codec without
// options gets: unknown fields are errors.
func DefaultOptions() *Options { return &Options{} }

// Factory builds the codec; it is registered from init.
var Factory = kernel.NewFactory(Name,
	"MessagePack (vmihailenco/msgpack/v5): plain Go structs by field name, msgpack struct tags honoured",
	DefaultOptions, New)

func init() { kernel.RegisterCodec(Factory) }

// New builds the codec from o.
func New(o *Options) (kernel.Codec, error) {
	c := &Codec{discardUnknown: o.DiscardUnknown}
	c.encoders.New = func() any {
		e := &encoder{}
		e.enc = msgpack.NewEncoder(&e.w)
		return e
	}
	// The decoders are made later, as calls need them: they take the
	// option as it is now, not from o, which the caller may change.
	c.decoders.New = func() any {
		d := &decoder{}
		d.dec = msgpack.NewDecoder(&d.r)
		d.dec.DisallowUnknownFields(!c.discardUnknown)
		return d
	}
	return c, nil
}

// Codec is the MessagePack codec; build it with New. It is safe for
// concurrent use.
type Codec struct {
	discardUnknown bool
	encoders       sync.Pool // *encoder
	decoders       sync.Pool // *decoder
}

var _ kernel.Codec = (*Codec)(nil)

// encoder writes straight into the caller's dst: the library takes a writer
// with WriteByte as is, without a buffer of its own.
type encoder struct {
	enc *msgpack.Encoder
	w   appendWriter
}

// decoder reads from a bytes.Reader, which the library uses as is (it is an
// io.ByteScanner), without copying the input into a buffer of its own.
type decoder struct {
	dec *msgpack.Decoder
	r   bytes.Reader
}

type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *appendWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}

func (w *appendWriter) WriteString(s string) (int, error) {
	w.b = append(w.b, s...)
	return len(s), nil
}

// ErrTrailingData is wrapped by the error for input that holds more than one
// MessagePack value.
var ErrTrailingData = errors.New("data after the MessagePack value")

// Name returns "msgpack".
func (*Codec) Name() string { return Name }

// Marshal appends the MessagePack encoding of v to dst.
func (c *Codec) Marshal(dst []byte, v any) ([]byte, error) {
	e := c.encoders.Get().(*encoder)
	e.w.b = dst
	err := e.enc.Encode(v)
	out := e.w.b
	e.w.b = nil // the pool must not keep the caller's buffer
	c.encoders.Put(e)
	if err != nil {
		return dst, fmt.Errorf("msgpack: marshal %T: %w", v, err)
	}
	return out, nil
}

// Unmarshal decodes data, one MessagePack value, into v, a non-nil pointer.
// v is reset first, so a reused value keeps nothing from its previous
// contents.
func (c *Codec) Unmarshal(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("msgpack: cannot unmarshal into %T; pass a non-nil pointer", v)
	}
	// The library merges into what v holds; the kernel's contract, like
	// proto.Unmarshal, is to replace it.
	rv.Elem().SetZero()
	n, err := check(data)
	switch {
	case err != nil:
		return fmt.Errorf("msgpack: unmarshal %d bytes into %T: %w", len(data), v, err)
	case n < len(data):
		return fmt.Errorf("msgpack: unmarshal %d bytes into %T: %w (%d bytes from byte %d)", len(data), v, ErrTrailingData, len(data)-n, n)
	}
	d := c.decoders.Get().(*decoder)
	d.r.Reset(data)
	d.dec.ResetReader(&d.r)
	panicked, err := d.decode(v)
	d.r.Reset(nil) // the pool must not keep the caller's input
	if !panicked {
		c.decoders.Put(d)
	}
	if err != nil {
		return fmt.Errorf("msgpack: unmarshal %d bytes into %T: %w%s", len(data), v, err, c.hint(err))
	}
	return nil
}

// decode runs the library's decoder, turning a panic into an error. The
// library panics on input check cannot refuse without knowing v's type: a
// map key that Go cannot hash (an array, a map, bytes) decoded into a map
// keyed by interface{}, or any value but nil decoded into an interface
// field with methods (a protobuf oneof, even as this codec encodes it).
// A peer's bytes must not take the process down (the
// server decodes requests outside the handler's recover). A decoder that
// panicked, in an unknown state, is not reused.
func (d *decoder) decode(v any) (panicked bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked, err = true, fmt.Errorf("the decoder panicked: %v", p)
		}
	}()
	return false, d.dec.Decode(v)
}

// hint says how to accept a message with fields this side does not know.
func (c *Codec) hint(err error) string {
	if !c.discardUnknown && strings.Contains(err.Error(), "unknown field") {
		return " (set the msgpack codec's option discard_unknown to ignore fields this side does not know)"
	}
	return ""
}
