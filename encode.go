package kernrpc

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/kernrpc/kernrpc/kernel"
)

// encodeInto encodes v with codec into a buffer conn lends, giving the
// buffer back when the encoding outgrew it or failed.
func encodeInto(conn kernel.Conn, codec kernel.Codec, v any) ([]byte, error) {
	size, err := sizeHint(codec, v)
	if err != nil {
		return nil, err
	}
	return encodeSized(conn, codec, v, size)
}

// encodeSized is encodeInto for a value whose size the caller has just
// taken with sizeHint, on this goroutine: a kernel.SizedMarshaler then
// need not size it again.
func encodeSized(conn kernel.Conn, codec kernel.Codec, v any, size int) (_ []byte, err error) {
	defer recoverCodec(codec, "encoding", &err)
	buf := conn.Buffer(size)
	var payload []byte
	if sm, ok := codec.(kernel.SizedMarshaler); ok && size > 0 {
		payload, err = sm.MarshalSized(buf, v, size)
	} else {
		payload, err = codec.Marshal(buf, v)
	}
	if err != nil || cap(buf) > 0 && (cap(payload) == 0 || &buf[:1][0] != &payload[:1][0]) {
		conn.Recycle(buf)
	}
	if err != nil {
		return nil, err
	}
	return payload, nil
}

// sizeHint is v's encoded size as codec tells it (kernel.CodecSizer), 0
// if it cannot. A codec that panics sizing v fails the message, as one
// that panics encoding it (codecPanic).
func sizeHint(codec kernel.Codec, v any) (_ int, err error) {
	s, ok := codec.(kernel.CodecSizer)
	if !ok {
		return 0, nil
	}
	defer recoverCodec(codec, "sizing", &err)
	return s.Size(v), nil
}

// copyThrough copies from into to by encoding it with codec and decoding
// the result: a client filter's own answer into the caller's reply.
func copyThrough(codec kernel.Codec, from, to any) (err error) {
	defer recoverCodec(codec, "copying a filter's answer", &err)
	data, err := codec.Marshal(nil, from)
	if err != nil {
		return err
	}
	return codec.Unmarshal(data, to)
}

// codecAliases reports whether values c decodes point into their input.
func codecAliases(c kernel.Codec) bool {
	a, ok := c.(kernel.AliasingCodec)
	return ok && a.AliasesInput()
}

// unmarshal decodes data into v with codec; fresh says v is a value the
// engine has just made and nobody else has seen (kernel.FreshUnmarshaler).
func unmarshal(codec kernel.Codec, data []byte, v any, fresh bool) (err error) {
	defer recoverCodec(codec, "decoding", &err)
	if fresh {
		if fu, ok := codec.(kernel.FreshUnmarshaler); ok {
			return fu.UnmarshalFresh(data, v)
		}
	}
	return codec.Unmarshal(data, v)
}

// unmarshalInPlace is unmarshal for a kernel.InPlaceUnmarshaler.
func unmarshalInPlace(codec kernel.Codec, d kernel.InPlaceUnmarshaler, data []byte, v any) (err error) {
	defer recoverCodec(codec, "decoding", &err)
	return d.UnmarshalInPlace(data, v)
}

// codecPanic is the error a codec that panicked gives instead. Codecs run
// outside any handler's recover (on the server, on a connection's
// goroutines; on the client, on the caller's), on a peer's bytes, and one
// message a codec cannot take (its bug, or its library's) must cost that
// call, not the process.
type codecPanic struct {
	codec, doing string
	value        any
	stack        []byte
}

func (p *codecPanic) Error() string {
	return fmt.Sprintf("codec %s panicked %s: %v", p.codec, p.doing, p.value)
}

// logCodecPanic logs err, with its stack, if it is a codec's panic, and
// says whether it was: the call gets Internal, the stack goes to the log
// of the side whose codec panicked.
func logCodecPanic(log *slog.Logger, method string, err error) bool {
	p, ok := err.(*codecPanic)
	if ok {
		log.Error("codec panicked", "method", method, "codec", p.codec, "doing", p.doing, "panic", p.value, "stack", string(p.stack))
	}
	return ok
}

// recoverCodec, deferred, turns a codec's panic into a *codecPanic in err.
func recoverCodec(codec kernel.Codec, doing string, err *error) {
	if r := recover(); r != nil {
		*err = &codecPanic{codec: codec.Name(), doing: doing, value: r, stack: debug.Stack()}
	}
}
