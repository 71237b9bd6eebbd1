package kernel

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"time"
)

// The frame format is shared by every transport that carries bytes; it is
// documented byte by byte in docs/protocol.md. A frame is
//
//	| 4B length | 1B magic | 1B version | 1B type | 1B flags | 8B call id |
//	| 4B fields length | fields (tag, uvarint length, value)... | payload |
//
// where length counts every byte after itself. Integers are big-endian.

// FrameType says what a frame carries.
type FrameType uint8

const (
	FrameRequest      FrameType = 1 // a call's request: method, codec, deadline, metadata, payload
	FrameResponse     FrameType = 2 // a call's answer: status, metadata, payload
	FrameCancel       FrameType = 3 // the client gave up on a call
	FramePing         FrameType = 4 // keepalive probe; the payload is echoed in the Pong
	FramePong         FrameType = 5 // keepalive answer
	FrameGoAway       FrameType = 6 // from a server: it is shutting down (no Message) or ending this connection (Message says why), send new calls elsewhere; from a client: the answer to a server's first GoAway (a shutdown's or an idle connection's), counting the requests it sent
	FrameStreamData   FrameType = 7 // one message of a stream, or (END_STREAM, empty) the client's half-close
	FrameWindowUpdate FrameType = 8 // flow-control credit for a stream, or call id 0: the connection
	maxFrameType                = FrameWindowUpdate
)

var frameTypeNames = [...]string{"", "Request", "Response", "Cancel", "Ping", "Pong", "GoAway", "StreamData", "WindowUpdate"}

func (t FrameType) String() string {
	if t > 0 && t <= maxFrameType {
		return frameTypeNames[t]
	}
	return "FrameType(" + strconv.Itoa(int(t)) + ")"
}

// FrameFlags are per-frame bits.
type FrameFlags uint8

const (
	// FlagEndStream marks the last frame a side sends on a call. Unary
	// requests and responses always carry it; on a stream, the client's
	// empty StreamData that half-closes it and the server's final Response.
	FlagEndStream FrameFlags = 1 << 0
	// FlagStream marks a request that opens a stream rather than a unary call.
	FlagStream FrameFlags = 1 << 1
	// FlagRetryable on a response says the server did not process the call.
	FlagRetryable FrameFlags = 1 << 2
)

const (
	// FrameMagic is the first byte after the length of every frame.
	FrameMagic = 0xCB
	// FrameVersion is the protocol version this kernel speaks.
	FrameVersion = 1
	// FramePrefixLen is the length field alone.
	FramePrefixLen = 4
	// FrameFixedLen is the fixed part after the length field: magic, version,
	// type, flags, call id and fields length.
	FrameFixedLen = 16
	// DefaultMaxFrameSize bounds the length field unless configured otherwise.
	DefaultMaxFrameSize = 4 << 20
	// MaxPingPayload bounds a Ping's payload: a liveness probe needs a few
	// bytes, and an answer as large as any frame would make the receiver an
	// amplifier. A larger Ping is a protocol error.
	MaxPingPayload = 64
	// GoAwayUnknownLast is the call id of a GoAway whose sender does not
	// know which calls it served (a transport ending a connection for a
	// broken rule): the receiver must not assume any call went unserved.
	GoAwayUnknownLast = 1<<64 - 1
)

// Field tags inside a frame's fields section. Unknown tags are skipped, so a
// newer peer may add fields without a version bump.
const (
	tagMethod   = 1
	tagCodec    = 2
	tagTimeout  = 3 // uvarint microseconds
	tagCode     = 4 // uvarint
	tagMessage  = 5
	tagMetadata = 6 // one pair: uvarint key length, key, value
	tagCredit   = 7 // uvarint bytes of stream flow-control credit
)

// ErrMalformedFrame is wrapped by every frame decoding error.
var ErrMalformedFrame = errors.New("malformed frame")

// ErrFrameTooLarge is wrapped when a frame's length exceeds the limit.
var ErrFrameTooLarge = errors.New("frame too large")

// ErrMetadataTooLarge is wrapped when a frame carries more metadata
// entries or bytes than its FrameLimits allow.
var ErrMetadataTooLarge = errors.New("metadata too large")

// Defaults for FrameLimits. A frame of tiny metadata pairs would otherwise
// become a map many times its own size (a 4 MiB frame, half a million
// entries); 64 KiB is four times what HTTP/2 servers usually accept in
// headers.
const (
	DefaultMaxMetadataEntries = 256
	DefaultMaxMetadataBytes   = 64 << 10
)

// FrameLimits bound what one frame may carry besides its length, which the
// transport checks against its max frame size before reading the frame.
// A zero field means the default.
type FrameLimits struct {
	// MaxMetadataEntries bounds the metadata pairs of one frame.
	MaxMetadataEntries int
	// MaxMetadataBytes bounds the keys and values of one frame, together.
	MaxMetadataBytes int
}

func (l FrameLimits) entries() int {
	if l.MaxMetadataEntries > 0 {
		return l.MaxMetadataEntries
	}
	return DefaultMaxMetadataEntries
}

func (l FrameLimits) bytes() int {
	if l.MaxMetadataBytes > 0 {
		return l.MaxMetadataBytes
	}
	return DefaultMaxMetadataBytes
}

// Check reports whether f, about to be written, stays within l. The error
// is a *Status (ResourceExhausted) wrapping ErrMetadataTooLarge, so that a
// transport refusing f fails only f's call.
func (l FrameLimits) Check(f *Frame) error {
	if len(f.Metadata) == 0 {
		return nil
	}
	if len(f.Metadata) > l.entries() {
		return RefusedFrame(ResourceExhausted, "metadata of "+strconv.Itoa(len(f.Metadata))+
			" entries exceeds max_metadata_entries "+strconv.Itoa(l.entries()), ErrMetadataTooLarge)
	}
	n := 0
	for k, v := range f.Metadata {
		n += len(k) + len(v)
	}
	if n > l.bytes() {
		return RefusedFrame(ResourceExhausted, "metadata of "+strconv.Itoa(n)+
			" bytes exceeds max_metadata_bytes "+strconv.Itoa(l.bytes()), ErrMetadataTooLarge)
	}
	return nil
}

// Frame is one message on a connection, decoded. Payload may point into
// memory the transport lends; call Release when done with it.
type Frame struct {
	Type     FrameType
	Flags    FrameFlags
	CallID   uint64
	Method   string        // requests
	Codec    string        // requests and responses
	Timeout  time.Duration // requests: what is left of the caller's deadline; 0 means none
	Code     Code          // responses
	Message  string        // responses: the status message
	Metadata Metadata      // requests and responses
	Credit   uint32        // WindowUpdate: bytes granted; a stream's Request: the client's stream window
	Payload  []byte

	owner FrameOwner
}

// FrameOwner takes back a frame (and the memory under its payload) that a
// transport handed out from ReadFrame.
type FrameOwner interface {
	ReleaseFrame(*Frame)
}

// SetOwner records who takes f back on Release. Transports call it on frames
// they hand out.
func (f *Frame) SetOwner(o FrameOwner) { f.owner = o }

// Release returns f and its payload to the transport that produced it. f
// must not be used afterwards. Release on a frame without owner (one a
// transport did not hand out, or already released) does nothing: it
// leaves the frame as it is.
func (f *Frame) Release() {
	if o := f.owner; o != nil {
		f.owner = nil
		o.ReleaseFrame(f)
	}
}

// Reset clears f for reuse, owner included.
func (f *Frame) Reset() {
	// A frame read off a stream carries a payload and no other pointer.
	// Zeroing the whole frame while the collector marks puts every pointer
	// word through the write barrier, and a receiver of small messages
	// allocates enough to keep the collector marking much of the time: it
	// spent about 3% of its CPU here. TestResetClearsEveryField keeps
	// this in step with the fields.
	if f.Method != "" || f.Codec != "" || f.Message != "" || f.Metadata != nil || f.owner != nil {
		*f = Frame{}
		return
	}
	if f.Payload != nil {
		f.Payload = nil
	}
	f.Type, f.Flags, f.CallID, f.Timeout, f.Code, f.Credit = 0, 0, 0, 0, 0, 0
}

// FrameHeaderLen returns how many bytes AppendFrameHeader writes for f.
func FrameHeaderLen(f *Frame) int {
	return FramePrefixLen + FrameFixedLen + fieldsLen(f)
}

func fieldsLen(f *Frame) int {
	n := 0
	if f.Method != "" {
		n += fieldLen(len(f.Method))
	}
	if f.Codec != "" {
		n += fieldLen(len(f.Codec))
	}
	if f.Timeout > 0 {
		n += fieldLen(uvarintLen(uint64(timeoutMicros(f.Timeout))))
	}
	if f.Code != OK {
		n += fieldLen(uvarintLen(uint64(wireCode(f.Code))))
	}
	if f.Message != "" {
		n += fieldLen(len(f.Message))
	}
	// Guarded: ranging over even a nil map calls into the runtime, some
	// 10 ns a frame, and most frames carry no metadata.
	if len(f.Metadata) > 0 {
		for k, v := range f.Metadata {
			n += fieldLen(uvarintLen(uint64(len(k))) + len(k) + len(v))
		}
	}
	if f.Credit != 0 {
		n += fieldLen(uvarintLen(uint64(f.Credit)))
	}
	return n
}

// maxWireCode is the largest status code DecodeFrame accepts.
const maxWireCode = 1 << 31

// wireCode is the code a frame carries for c: c itself, or Unknown for a
// code above what DecodeFrame accepts, which a handler's status may hold
// (Code is a uint32): sent as it is, it would make the receiver close the
// connection, failing every call on it instead of this one.
func wireCode(c Code) Code {
	if c > maxWireCode {
		return Unknown
	}
	return c
}

func timeoutMicros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if us == 0 {
		us = 1 // a positive timeout below 1µs must not read as "no deadline"
	}
	return us
}

func fieldLen(valueLen int) int { return 1 + uvarintLen(uint64(valueLen)) + valueLen }

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// AppendFrameHeader appends everything of f up to its payload: the length
// (which counts len(f.Payload)), the fixed part and the fields. The caller
// writes f.Payload right after.
func AppendFrameHeader(dst []byte, f *Frame) []byte {
	fl := fieldsLen(f)
	length := FrameFixedLen + fl + len(f.Payload)
	dst = binary.BigEndian.AppendUint32(dst, uint32(length))
	dst = append(dst, FrameMagic, FrameVersion, byte(f.Type), byte(f.Flags))
	dst = binary.BigEndian.AppendUint64(dst, f.CallID)
	dst = binary.BigEndian.AppendUint32(dst, uint32(fl))
	if f.Method != "" {
		dst = appendStringField(dst, tagMethod, f.Method)
	}
	if f.Codec != "" {
		dst = appendStringField(dst, tagCodec, f.Codec)
	}
	if f.Timeout > 0 {
		dst = appendUvarintField(dst, tagTimeout, uint64(timeoutMicros(f.Timeout)))
	}
	if f.Code != OK {
		dst = appendUvarintField(dst, tagCode, uint64(wireCode(f.Code)))
	}
	if f.Message != "" {
		dst = appendStringField(dst, tagMessage, f.Message)
	}
	if len(f.Metadata) > 0 { // see fieldsLen
		for k, v := range f.Metadata {
			dst = append(dst, tagMetadata)
			dst = binary.AppendUvarint(dst, uint64(uvarintLen(uint64(len(k)))+len(k)+len(v)))
			dst = binary.AppendUvarint(dst, uint64(len(k)))
			dst = append(dst, k...)
			dst = append(dst, v...)
		}
	}
	if f.Credit != 0 {
		dst = appendUvarintField(dst, tagCredit, uint64(f.Credit))
	}
	return dst
}

func appendStringField(dst []byte, tag byte, s string) []byte {
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendUvarintField(dst []byte, tag byte, x uint64) []byte {
	dst = append(dst, tag, byte(uvarintLen(x)))
	return binary.AppendUvarint(dst, x)
}

// ReadFrameLength decodes the 4-byte length prefix and checks it against
// max before the caller allocates anything for the frame. A max of 0 or
// less means no maximum, but a length an int cannot hold (over 2 GiB on a
// 32-bit platform) is still ErrFrameTooLarge.
func ReadFrameLength(prefix []byte, max int) (int, error) {
	if len(prefix) < FramePrefixLen {
		return 0, malformed(strconv.Itoa(len(prefix)) + " bytes, shorter than the length prefix (4)")
	}
	n := binary.BigEndian.Uint32(prefix)
	if n < FrameFixedLen {
		return 0, &frameError{err: ErrMalformedFrame, msg: "length " + strconv.FormatUint(uint64(n), 10) + " is shorter than the fixed header (16)"}
	}
	if max > 0 && uint64(n) > uint64(max) {
		return 0, &frameError{err: ErrFrameTooLarge, msg: "length " + strconv.FormatUint(uint64(n), 10) + " exceeds the maximum frame size " + strconv.Itoa(max)}
	}
	if uint64(n) > math.MaxInt {
		// Only where an int has 32 bits, and with no maximum set: the
		// length would turn negative.
		return 0, &frameError{err: ErrFrameTooLarge, msg: "length " + strconv.FormatUint(uint64(n), 10) + " exceeds the largest frame this platform can hold (" + strconv.Itoa(math.MaxInt) + ")"}
	}
	return int(n), nil
}

type frameError struct {
	err error
	msg string
}

func (e *frameError) Error() string { return e.err.Error() + ": " + e.msg }
func (e *frameError) Unwrap() error { return e.err }

func malformed(msg string) error { return &frameError{err: ErrMalformedFrame, msg: msg} }

// DecodeFrame decodes body, the bytes that followed the length prefix, into
// f, which should be reset first: fields absent from body are left as they
// were. f.Payload aliases body. Strings go through in when it is not nil, so
// that the same method and codec names do not allocate on every frame.
// Metadata is held to the default FrameLimits.
func DecodeFrame(body []byte, f *Frame, in *Interner) error {
	return FrameLimits{}.Decode(body, f, in)
}

// Decode is DecodeFrame with l's limits on metadata: a frame over them is
// an error wrapping ErrMetadataTooLarge (and ErrMalformedFrame: a peer
// that keeps to the limits it was configured with never sends one).
func (lim FrameLimits) Decode(body []byte, f *Frame, in *Interner) error {
	if len(body) < FrameFixedLen {
		return malformed("truncated fixed header: " + strconv.Itoa(len(body)) + " of 16 bytes")
	}
	if body[0] != FrameMagic {
		return malformed("bad magic byte 0x" + strconv.FormatUint(uint64(body[0]), 16) + ", want 0xcb (is the peer speaking kernrpc?)")
	}
	if body[1] != FrameVersion {
		return malformed("unsupported protocol version " + strconv.Itoa(int(body[1])) + " (this side speaks 1)")
	}
	t := FrameType(body[2])
	if t == 0 || t > maxFrameType {
		return malformed("unknown frame type " + strconv.Itoa(int(t)))
	}
	f.Type = t
	f.Flags = FrameFlags(body[3])
	f.CallID = binary.BigEndian.Uint64(body[4:12])
	fl := binary.BigEndian.Uint32(body[12:16])
	if uint64(fl) > uint64(len(body)-FrameFixedLen) {
		return malformed("fields length " + strconv.FormatUint(uint64(fl), 10) + " runs past the frame end")
	}
	fields := body[FrameFixedLen : FrameFixedLen+int(fl)]
	f.Payload = body[FrameFixedLen+int(fl):]
	mdPairs, mdBytes := 0, 0
	var seen uint8 // known single-valued tags met so far
	for len(fields) > 0 {
		tag := fields[0]
		l, n := binary.Uvarint(fields[1:])
		if n <= 0 || l > uint64(len(fields)-1-n) {
			return malformed("field with tag " + strconv.Itoa(int(tag)) + " runs past the fields section")
		}
		// A repeated field would mean whichever value a reader keeps: one
		// peer (or a filter, a proxy) could act on another than the next.
		if tag >= tagMethod && tag <= tagCredit && tag != tagMetadata {
			if seen&(1<<tag) != 0 {
				return malformed("field with tag " + strconv.Itoa(int(tag)) + " appears twice")
			}
			seen |= 1 << tag
		}
		v := fields[1+n : 1+n+int(l)]
		fields = fields[1+n+int(l):]
		switch tag {
		case tagMethod:
			f.Method = in.String(v)
		case tagCodec:
			f.Codec = in.String(v)
		case tagTimeout:
			us, err := fieldUvarint(tag, v)
			if err != nil {
				return err
			}
			if us > uint64(1<<63-1)/uint64(time.Microsecond) {
				us = uint64(1<<63-1) / uint64(time.Microsecond)
			}
			if us == 0 {
				// No time left is still a deadline: Timeout 0 would read
				// as none. The least one, as timeoutMicros writes below 1µs.
				us = 1
			}
			f.Timeout = time.Duration(us) * time.Microsecond
		case tagCode:
			c, err := fieldUvarint(tag, v)
			if err != nil {
				return err
			}
			if c > maxWireCode {
				return malformed("status code " + strconv.FormatUint(c, 10) + " out of range")
			}
			f.Code = Code(c)
		case tagMessage:
			f.Message = string(v)
		case tagMetadata:
			kl, kn := binary.Uvarint(v)
			if kn <= 0 || kl > uint64(len(v)-kn) {
				return malformed("metadata key runs past its field")
			}
			if f.Metadata == nil {
				f.Metadata = make(Metadata, 4)
			}
			// Pairs, not the map's entries: pairs repeating a key (empty
			// ones cost no bytes) must not pass the entry limit.
			mdPairs++
			if mdBytes += len(v) - kn; mdPairs > lim.entries() || mdBytes > lim.bytes() {
				return lim.metadataError(f, mdBytes)
			}
			f.Metadata[string(v[kn:kn+int(kl)])] = string(v[kn+int(kl):])
		case tagCredit:
			c, err := fieldUvarint(tag, v)
			if err != nil {
				return err
			}
			if c > 1<<32-1 {
				return malformed("credit out of range")
			}
			f.Credit = uint32(c)
		}
	}
	return nil
}

// RefusedFrame is the error a transport returns from WriteFrame for a
// frame it refuses alone, sending nothing of it: a *Status with code and
// msg, so that the engine fails only that call (or, for an answer, sends
// the status instead), which also wraps cause (ErrFrameTooLarge, say).
func RefusedFrame(code Code, msg string, cause error) error {
	return &refusal{st: &Status{Code: code, Message: msg}, cause: cause}
}

type refusal struct {
	st    *Status
	cause error
}

func (r *refusal) Error() string   { return r.st.Error() }
func (r *refusal) Unwrap() []error { return []error{r.st, r.cause} }

func (l FrameLimits) metadataError(f *Frame, n int) error {
	msg := "more than " + strconv.Itoa(l.entries()) + " metadata entries"
	if n > l.bytes() {
		msg = "more than " + strconv.Itoa(l.bytes()) + " bytes of metadata"
	}
	return &frameError{err: errors.Join(ErrMalformedFrame, ErrMetadataTooLarge), msg: msg + " in " + f.Type.String() + " " + strconv.FormatUint(f.CallID, 10)}
}

func fieldUvarint(tag byte, v []byte) (uint64, error) {
	x, n := binary.Uvarint(v)
	if n <= 0 || n != len(v) {
		return 0, malformed("field with tag " + strconv.Itoa(int(tag)) + " is not one uvarint")
	}
	return x, nil
}

// Interner turns repeated byte strings (method and codec names) into the
// same string without allocating each time. It is bounded, so a peer sending
// endless distinct names costs allocations but not memory. Not safe for
// concurrent use: one per connection read side.
type Interner struct {
	m map[string]string
}

const internerMax = 512

// String returns b as a string, reusing an earlier copy when there is one.
// A nil *Interner just converts.
func (in *Interner) String(b []byte) string {
	if in == nil {
		return string(b)
	}
	if s, ok := in.m[string(b)]; ok {
		return s
	}
	s := string(b)
	if in.m == nil {
		in.m = make(map[string]string)
	}
	if len(in.m) < internerMax && len(s) <= 256 {
		in.m[s] = s
	}
	return s
}
