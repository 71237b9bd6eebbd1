package kernrpc

import "github.com/kernrpc/kernrpc/kernel"

// encodeInto encodes v with codec into a buffer conn lends, giving the
// buffer back when the encoding outgrew it or failed.
func encodeInto(conn kernel.Conn, codec kernel.Codec, v any) ([]byte, error) {
	return encodeSized(conn, codec, v, sizeHint(codec, v))
}

// encodeSized is encodeInto for a value whose size the caller knows.
func encodeSized(conn kernel.Conn, codec kernel.Codec, v any, size int) ([]byte, error) {
	buf := conn.Buffer(size)
	payload, err := codec.Marshal(buf, v)
	if err != nil || cap(buf) > 0 && (cap(payload) == 0 || &buf[:1][0] != &payload[:1][0]) {
		conn.Recycle(buf)
	}
	if err != nil {
		return nil, err
	}
	return payload, nil
}

func sizeHint(codec kernel.Codec, v any) int {
	if s, ok := codec.(kernel.CodecSizer); ok {
		return s.Size(v)
	}
	return 0
}

// codecAliases reports whether values c decodes point into their input.
func codecAliases(c kernel.Codec) bool {
	a, ok := c.(kernel.AliasingCodec)
	return ok && a.AliasesInput()
}
