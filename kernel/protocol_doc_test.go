package kernel

import (
	"bytes"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// TestProtocolDocExample keeps the byte-by-byte example in docs/protocol.md
// true: it is what AppendFrameHeader produces, and DecodeFrame reads it back.
func TestProtocolDocExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "## Example")
	if !ok {
		t.Fatal("docs/protocol.md has no ## Example section")
	}
	_, block, _ := strings.Cut(rest, "```\n")
	block, _, _ = strings.Cut(block, "```")
	var hexDigits strings.Builder
	for _, line := range strings.Split(block, "\n") {
		// Each line is hex bytes, then two or more spaces, then a comment.
		code, _, _ := strings.Cut(line, "  ")
		hexDigits.WriteString(strings.ReplaceAll(code, " ", ""))
	}
	want, err := hex.DecodeString(hexDigits.String())
	if err != nil {
		t.Fatalf("example is not hex: %v", err)
	}
	f := &Frame{Type: FrameRequest, Flags: FlagEndStream, CallID: 1, Method: "Echo.Say", Codec: "protobuf", Payload: []byte{0x0a, 0x02, 0x68, 0x69}}
	got := append(AppendFrameHeader(nil, f), f.Payload...)
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/protocol.md example is out of date:\n doc: % x\n code: % x", want, got)
	}
	var back Frame
	if err := DecodeFrame(got[FramePrefixLen:], &back, nil); err != nil {
		t.Fatal(err)
	}
	if back.Method != f.Method || back.Codec != f.Codec || back.CallID != 1 || !bytes.Equal(back.Payload, f.Payload) {
		t.Fatalf("decoded %+v", back)
	}
}

// TestProtocolDocStreamExample keeps the stream example in docs/protocol.md
// true: its bytes are what AppendFrameHeader produces for each frame of a
// server stream, in order, and the credit rule's costs hold.
func TestProtocolDocStreamExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "### Example: a server stream")
	if !ok {
		t.Fatal("docs/protocol.md has no stream example")
	}
	_, block, _ := strings.Cut(rest, "```\n")
	block, _, _ = strings.Cut(block, "```")
	var hexDigits strings.Builder
	for _, line := range strings.Split(block, "\n") {
		code, _, _ := strings.Cut(line, "  ")
		hexDigits.WriteString(strings.ReplaceAll(code, " ", ""))
	}
	doced, err := hex.DecodeString(hexDigits.String())
	if err != nil {
		t.Fatalf("example is not hex: %v", err)
	}
	frames := []*Frame{
		{Type: FrameWindowUpdate, Credit: 16 << 20},
		{Type: FrameRequest, Flags: FlagStream, CallID: 1, Method: "Count.Up", Codec: "protobuf", Credit: 256 << 10},
		{Type: FrameStreamData, CallID: 1, Payload: []byte{0x12, 0x01, 0x33}},
		{Type: FrameStreamData, Flags: FlagEndStream, CallID: 1},
		{Type: FrameWindowUpdate, Credit: 16 << 20},
		{Type: FrameWindowUpdate, CallID: 1, Credit: 256 << 10},
		{Type: FrameStreamData, CallID: 1, Payload: []byte{0x12, 0x01, 0x30}},
		{Type: FrameResponse, Flags: FlagEndStream, CallID: 1},
	}
	var want []byte
	for _, f := range frames {
		want = append(AppendFrameHeader(want, f), f.Payload...)
	}
	if !bytes.Equal(doced, want) {
		t.Fatalf("docs/protocol.md stream example is out of date:\n doc: % x\n code: % x", doced, want)
	}
	// The message frames cost what the comments say: their length field.
	for _, i := range []int{2, 6} {
		if cost, n := StreamCost(len(frames[i].Payload)), FrameHeaderLen(frames[i])-FramePrefixLen+len(frames[i].Payload); cost != int64(n) {
			t.Errorf("frame %d costs %d, but its length is %d", i, cost, n)
		}
	}
}

// TestProtocolDocFieldsTableNamesEveryFrameTheyGoOn keeps the "on" column
// of docs/protocol.md's fields table true to what kernrpc sends: a peer
// written from the table must expect each field on each frame type that
// carries it. The pairs are the engine's: GoAway's reason in `message`
// (server_drain.go, server_limits.go), the server's stream headers in
// `metadata` on its first StreamData (stream_core.go).
func TestProtocolDocFieldsTableNamesEveryFrameTheyGoOn(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "### Fields")
	if !ok {
		t.Fatal("docs/protocol.md has no ### Fields section")
	}
	rest, _, _ = strings.Cut(rest, "\n### ")
	on := map[string]string{}
	for _, line := range strings.Split(rest, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 6 {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[2]), "`")
		on[name] = strings.TrimSpace(cells[len(cells)-2])
	}
	for _, tc := range []struct{ field, frames string }{
		{"method", "Request"},
		{"codec", "Request, Response"},
		{"timeout", "Request"},
		{"code", "Response, Cancel"},
		{"message", "Response, GoAway"},
		{"metadata", "Request, Response, StreamData"},
		{"credit", "WindowUpdate, Request"},
	} {
		for _, typ := range strings.Split(tc.frames, ", ") {
			if !strings.Contains(on[tc.field], typ) {
				t.Errorf("field %s goes on %s frames; the table says it goes on %q", tc.field, typ, on[tc.field])
			}
		}
	}
}
