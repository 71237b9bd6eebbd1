package kernrpc

import "github.com/kernrpc/kernrpc/kernel"

// encodeInto encodes v with codec into a buffer conn lends, giving the
// buffer back when the encoding outgrew it or failed.
func encodeInto(conn kernel.Conn, codec kernel.Codec, v any) ([]byte, error) {
	return encodeSized(conn, codec, v, sizeHint(codec, v))
}

// encodeSized is encodeInto for a value whose size the caller has just
// taken with sizeHint, on this goroutine: a kernel.SizedMarshaler then
// need not size it again.
func encodeSized(conn kernel.Conn, codec kernel.Codec, v any, size int) ([]byte, error) {
	buf := conn.Buffer(size)
	var payload []byte
	var err error
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

// unmarshal decodes data into v with codec; fresh says v is a value the
// engine has just made and nobody else has seen (kernel.FreshUnmarshaler).
func unmarshal(codec kernel.Codec, data []byte, v any, fresh bool) error {
	if fresh {
		if fu, ok := codec.(kernel.FreshUnmarshaler); ok {
			return fu.UnmarshalFresh(data, v)
		}
	}
	return codec.Unmarshal(data, v)
}
