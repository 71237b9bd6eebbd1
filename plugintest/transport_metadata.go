package plugintest

import (
	"strconv"
	"strings"

	"github.com/kernrpc/kernrpc/kernel"
)

// metadataLimits sends frames at the configured metadata limits, which
// must cross intact, and one over each, which must be refused as a frame
// over the maximum size is: a transport that decoded them would let a
// peer turn one frame into a map many times its size.
func (e *transportEnv) metadataLimits(t tb) {
	entries, bytes := e.mdLimits.MaxMetadataEntries, e.mdLimits.MaxMetadataBytes
	byCount := func(callID uint64, n int) *kernel.Frame {
		md := make(kernel.Metadata, n)
		for i := range n {
			md["k"+strconv.Itoa(i)] = "v"
		}
		return &kernel.Frame{Type: kernel.FrameRequest, CallID: callID, Metadata: md, Payload: []byte("after the metadata")}
	}
	bySize := func(callID uint64, n int) *kernel.Frame {
		return &kernel.Frame{Type: kernel.FrameRequest, CallID: callID, Metadata: kernel.Metadata{"k": strings.Repeat("v", n-1)}, Payload: []byte("after the metadata")}
	}
	t.Run("AtTheLimits", func(t tb) {
		var frames []*kernel.Frame
		for _, f := range []*kernel.Frame{byCount(1, entries), bySize(2, bytes)} {
			if transportBodyLen(f)+len(f.Payload) <= e.max {
				frames = append(frames, f)
			}
		}
		if len(frames) == 0 {
			t.Skipf("no frame at the metadata limits (%d entries, %d bytes) fits the maximum frame size %d", entries, bytes, e.max)
		}
		e.crossAll(t, frames, "MetadataLimits/AtTheLimits")
	})
	tr := e.transport(t)
	l := e.listen(t, tr)
	for _, over := range []struct {
		name string
		f    *kernel.Frame
		desc string
	}{
		{"OneEntryOver", byCount(3, entries+1), "with " + strconv.Itoa(entries+1) + " metadata entries, over the limit of " + strconv.Itoa(entries)},
		{"OneByteOver", bySize(4, bytes+1), "with " + strconv.Itoa(bytes+1) + " bytes of metadata, over the limit of " + strconv.Itoa(bytes)},
	} {
		t.Run(over.name, func(t tb) {
			if transportBodyLen(over.f)+len(over.f.Payload) > e.max {
				t.Skipf("a frame %s does not fit the maximum frame size %d", over.desc, e.max)
			}
			client, server := e.connect(t, tr, l)
			f := transportHeader(over.f)
			f.Payload = append(client.Buffer(len(over.f.Payload)), over.f.Payload...)
			e.refusal(t, client, server, f, "client→server", kernel.ErrMetadataTooLarge, over.desc)
		})
	}
}
