//go:build linux

package shmring

import (
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// The reader decodes each frame's header from a private copy. One frame
// with a large header (a long status message, or metadata under a raised
// max_metadata_bytes) must not leave a buffer that large with the
// connection for the rest of its life, as the writer's header buffer is
// bounded by maxKeptHeader.
func TestALargeFrameHeaderIsNotKeptByTheReader(t *testing.T) {
	o := testOptions()
	o.MaxMetadataBytes = 2 << 20
	client, server := connPair(t, o)
	big := &kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: 1,
		Code: kernel.Internal, Message: strings.Repeat("m", 1<<20),
		Metadata: kernel.Metadata{"k": strings.Repeat("v", 512<<10)}}
	sent := make(chan error, 1)
	go func() {
		big.Payload = append(client.Buffer(7), "payload"...)
		sent <- client.WriteFrame(big) // chunked: it waits for the reader
	}()
	f := recv(t, server)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if len(f.Message) != 1<<20 || len(f.Metadata["k"]) != 512<<10 {
		t.Fatalf("read a message of %d bytes and metadata of %d, want %d and %d", len(f.Message), len(f.Metadata["k"]), 1<<20, 512<<10)
	}
	f.Release()
	send(t, client, &kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: 2}, []byte("small"))
	recv(t, server).Release()
	if n := cap(server.in.fields); n > maxKeptHeader {
		t.Errorf("after a frame with a 1.5 MiB header, the reader keeps a %d-byte header buffer; want at most %d", n, maxKeptHeader)
	}
}
