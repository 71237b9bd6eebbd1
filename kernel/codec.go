package kernel

// Codec turns messages into bytes and back. One codec value serves many
// goroutines at once. The codec's name travels in every request, and the
// server answers in the codec the client used.
type Codec interface {
	// Name is the codec's config name; it is stable and non-empty.
	Name() string
	// Marshal appends the encoding of v to dst and returns the extended
	// slice. It must not modify dst[:len(dst)].
	Marshal(dst []byte, v any) ([]byte, error)
	// Unmarshal decodes data into v, which is a pointer the codec knows,
	// replacing what v held: nothing of its earlier contents remains (a
	// caller may reuse one reply value across calls). Input the format
	// does not define as one encoding (cut short, followed by more bytes,
	// garbage) is an error, never a panic.
	Unmarshal(data []byte, v any) error
}

// CodecSizer is an optional interface: a codec that can tell the encoded
// size of v cheaply lets the engine ask the transport for a buffer of the
// right size, so the encoding lands without a reallocation.
type CodecSizer interface {
	Size(v any) int
}

// AliasingCodec is an optional interface for codecs whose decoded values
// point into the bytes they were decoded from (FlatBuffers reads fields in
// place). The engine then keeps those bytes alive and unchanged for as long
// as the value may be read: on the server until the handler has returned
// and its response is encoded (the response may point into the request),
// on the client it hands the caller a private copy of a lent payload.
type AliasingCodec interface {
	AliasesInput() bool
}

// InPlaceUnmarshaler is an optional interface for codecs that decode by
// copying in Unmarshal but can also decode in place, leaving v pointing
// into data (the protobuf codec's alias_requests option). The server uses
// UnmarshalInPlace for requests, and keeps their bytes alive and unchanged
// as for an AliasingCodec; clients keep calling Unmarshal, which copies into
// the caller's reply.
type InPlaceUnmarshaler interface {
	UnmarshalInPlace(data []byte, v any) error
}

// SizedMarshaler is an optional interface for a CodecSizer whose Marshal
// would size v over again: the engine, having just taken Size(v) on the
// same goroutine with nothing changing v since, hands that size to
// MarshalSized, which may then encode from what Size left behind (the
// protobuf codec from the sizes protobuf-go caches in the message). It
// returns what Marshal would, and an error, never a corrupt encoding,
// when v's encoding is not size bytes long after all (a caller that
// changed v meanwhile, a data race).
type SizedMarshaler interface {
	MarshalSized(dst []byte, v any, size int) ([]byte, error)
}

// FreshUnmarshaler is an optional interface for codecs that decode faster
// into a value they need not clear first. UnmarshalFresh is Unmarshal into
// a v that the engine has just made (new(T)) and nobody else has seen: a
// typed handler's request, a typed stream's message. It must leave v as
// Unmarshal would.
type FreshUnmarshaler interface {
	UnmarshalFresh(data []byte, v any) error
}
