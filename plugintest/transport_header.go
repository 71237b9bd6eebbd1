package plugintest

import (
	"strconv"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportVarintEdges are the values on both sides of every width a
// uvarint (docs/protocol.md) takes, from one byte to ten, up to limit.
func transportVarintEdges(limit uint64) []uint64 {
	out := []uint64{0, 1}
	for k := 7; k < 64; k += 7 {
		b := uint64(1) << k
		if b-1 > limit {
			break
		}
		out = append(out, b-1)
		if b <= limit {
			out = append(out, b)
		}
	}
	return append(out, limit)
}

// frameWidths sends frames whose header values and lengths lie on both
// sides of every uvarint width: call ids (fixed 8 bytes in the kernel's
// encoding, but a transport may encode them its own way), timeouts, codes
// and credits, the lengths of the method, codec, message, metadata keys
// and values, and the number of metadata entries. Each frame must fit the
// maximum with a small payload, which must land where it belongs.
func (e *transportEnv) frameWidths(t tb) {
	var frames []*kernel.Frame
	add := func(what string, f *kernel.Frame) {
		f.Payload = []byte("after " + what)
		if e.fits(f) {
			frames = append(frames, f)
		}
	}
	for _, id := range transportVarintEdges(1<<64 - 1) {
		add("call id "+strconv.FormatUint(id, 10), &kernel.Frame{Type: kernel.FrameCancel, CallID: id})
	}
	// Timeouts cross in whole microseconds; the largest is the largest
	// whole number of them a time.Duration holds.
	maxMicros := uint64(1<<63-1) / uint64(time.Microsecond)
	for _, us := range transportVarintEdges(maxMicros) {
		if us == 0 {
			continue // no timeout: absent
		}
		add("timeout "+strconv.FormatUint(us, 10)+"µs", &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1, Method: "/w.W/T", Timeout: time.Duration(us) * time.Microsecond})
	}
	// Codes up to 1<<31, the largest the kernel's decoder accepts.
	for _, c := range append(transportVarintEdges(1<<31), 16, 17) {
		add("code "+strconv.FormatUint(c, 10), &kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: 2, Code: kernel.Code(c), Message: "m"})
	}
	for _, c := range transportVarintEdges(1<<32 - 1) {
		add("credit "+strconv.FormatUint(c, 10), &kernel.Frame{Type: kernel.FrameWindowUpdate, CallID: 3, Credit: uint32(c)})
	}
	for _, n := range transportVarintEdges(1 << 21) {
		if n == 0 || n > uint64(e.max) {
			continue
		}
		s := string(transportPrintable(n, int(n)))
		add("a method of "+strconv.FormatUint(n, 10)+" bytes", &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 4, Method: s})
		add("a metadata value of "+strconv.FormatUint(n, 10)+" bytes", &kernel.Frame{Type: kernel.FrameRequest, CallID: 8, Metadata: kernel.Metadata{"k": s}})
		if n >= 1<<21-1 {
			continue // megabytes: the two fields above stand for the rest
		}
		add("a codec of "+strconv.FormatUint(n, 10)+" bytes", &kernel.Frame{Type: kernel.FrameResponse, CallID: 5, Codec: s})
		add("a message of "+strconv.FormatUint(n, 10)+" bytes", &kernel.Frame{Type: kernel.FrameResponse, CallID: 6, Code: kernel.Internal, Message: s})
		add("a metadata key of "+strconv.FormatUint(n, 10)+" bytes", &kernel.Frame{Type: kernel.FrameRequest, CallID: 7, Metadata: kernel.Metadata{s: "v"}})
		// With a one-byte key, the metadata field's own length is the
		// value's plus 2: make that cross the width instead.
		if n >= 2 {
			add("a metadata field of "+strconv.FormatUint(n, 10)+" bytes", &kernel.Frame{Type: kernel.FrameRequest, CallID: 9, Metadata: kernel.Metadata{"k": s[:n-2]}})
		}
	}
	for _, n := range []int{1, 127, 128, 129, 255, 256, 1000} {
		md := make(kernel.Metadata, n)
		for i := range n {
			md["k"+strconv.Itoa(i)] = strconv.Itoa(i * 7)
		}
		add(strconv.Itoa(n)+" metadata entries", &kernel.Frame{Type: kernel.FrameRequest, CallID: 10, Metadata: md})
	}
	e.crossAll(t, frames, "Widths")
}

// frameStrings sends long and unusual strings in every header field:
// empty ones, non-ASCII UTF-8, control characters and bytes that look
// like the separators of text encodings, keys that differ only in case,
// many metadata entries, and (in metadata, which the protocol does not
// require to be UTF-8) bytes that are not UTF-8 at all.
func (e *transportEnv) frameStrings(t tb) {
	unusual := []string{
		"", " ", "a", "/", "//", ".", "*",
		"Ünïcødé", "日本語のメソッド", "🚀✨", "\u200b\u200d", "\u00e9\u0301",
		"\x00", "a\x00b", "\r\n", "line1\nline2", "tab\there",
		"k: v\r\nX-Injected: 1", "a=b; c=d, e", `"quoted"`, `\`, "%00%zz", "{}[]<>",
		transportRepeat("é", 1000),
	}
	binary := []string{"\xff\xfe\xfd", "\xc3", "\xed\xa0\x80", "\x80" + strings.Repeat("\x00\xff", 64)}
	var all [256]byte
	for i := range all {
		all[i] = byte(i)
	}
	binary = append(binary, string(all[:]))

	var frames []*kernel.Frame
	add := func(f *kernel.Frame) {
		f.Payload = []byte("payload")
		if e.fits(f) {
			frames = append(frames, f)
		}
	}
	for i, s := range unusual {
		add(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: uint64(i + 1), Method: s, Codec: s, Metadata: kernel.Metadata{"m": s}})
		add(&kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: uint64(i + 1), Code: kernel.Aborted, Message: s, Metadata: kernel.Metadata{s: "key"}})
	}
	// Every unusual and binary string as a key, with another as its value;
	// keys that differ only in case are different keys.
	md := kernel.Metadata{"Trace-Id": "1", "trace-id": "2", "TRACE-ID": "3", "": "empty key", "empty value": ""}
	keys := append(append([]string{}, unusual...), binary...)
	for i, k := range keys {
		if _, dup := md[k]; !dup {
			md[k] = keys[(i+1)%len(keys)]
		}
	}
	add(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 100, Method: "/s.S/M", Metadata: md})
	// Long strings, within a quarter of the maximum each.
	long := min(e.max/4, 256<<10)
	add(&kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 101, Method: "/" + transportRepeat("Ünïcødé.Sërvicé/", long-1)})
	add(&kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: 101, Code: kernel.Internal, Message: transportRepeat("a long status message\n", long)})
	mdLong := min(long, e.mdLimits.MaxMetadataBytes/3)
	add(&kernel.Frame{Type: kernel.FrameRequest, CallID: 102, Metadata: kernel.Metadata{"long": string(transportFill(nil, 102, mdLong)), transportRepeat("long-key-", mdLong/2): "v"}})
	// Many entries, the most that fit a quarter of the maximum and the
	// metadata limits.
	many := make(kernel.Metadata)
	for i := 0; 24*len(many) < min(long, e.mdLimits.MaxMetadataBytes) && len(many) < e.mdLimits.MaxMetadataEntries; i++ {
		many["x-key-"+strconv.Itoa(i)] = "value " + strconv.Itoa(i)
	}
	add(&kernel.Frame{Type: kernel.FrameRequest, CallID: 103, Metadata: many})
	e.crossAll(t, frames, "Strings")
}

// crossAll sends every frame both ways on one connection and fails at the
// first that arrives changed.
func (e *transportEnv) crossAll(t tb, frames []*kernel.Frame, check string) {
	t.Helper()
	p := e.pair(t)
	for i, want := range frames {
		for j, dir := range []struct {
			name     string
			from, to kernel.Conn
		}{{"client→server", p.client, p.server}, {"server→client", p.server, p.client}} {
			if transportBodyLen(want) > transportOneWay && (i+j)%2 == 1 {
				continue // large frames go one way each, alternately
			}
			got := e.transfer(t, dir.from, dir.to, want)
			d := transportDiff(got, want)
			got.Release()
			if d != "" {
				t.Fatalf("%s: %s frame %d of %d (%s, %d header bytes) arrived changed: %s; every header field must cross exactly as written",
					dir.name, check, i, len(frames), transportDescribe(want), transportBodyLen(want), d)
			}
		}
	}
}

// transportDescribe says briefly what is unusual in f, for messages.
func transportDescribe(f *kernel.Frame) string {
	var parts []string
	short := func(s string) string {
		if len(s) > 40 {
			return strconv.Quote(s[:40]) + "... (" + strconv.Itoa(len(s)) + " bytes)"
		}
		return strconv.Quote(s)
	}
	parts = append(parts, f.Type.String(), "call id "+strconv.FormatUint(f.CallID, 10))
	if f.Method != "" {
		parts = append(parts, "method "+short(f.Method))
	}
	if f.Codec != "" {
		parts = append(parts, "codec "+short(f.Codec))
	}
	if f.Timeout != 0 {
		parts = append(parts, "timeout "+f.Timeout.String())
	}
	if f.Code != 0 {
		parts = append(parts, "code "+strconv.FormatUint(uint64(f.Code), 10))
	}
	if f.Message != "" {
		parts = append(parts, "message "+short(f.Message))
	}
	if f.Credit != 0 {
		parts = append(parts, "credit "+strconv.FormatUint(uint64(f.Credit), 10))
	}
	if n := len(f.Metadata); n > 0 {
		parts = append(parts, strconv.Itoa(n)+" metadata entries")
	}
	return strings.Join(parts, ", ")
}
