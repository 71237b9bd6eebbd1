//go:build linux

package shmring

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

func metadataOf(n int) kernel.Metadata {
	md := make(kernel.Metadata, n)
	for i := range n {
		md["k"+strconv.Itoa(i)] = "v"
	}
	return md
}

// A frame with more metadata than the writer's limit is refused alone;
// one that a laxer peer writes anyway closes the reader's connection
// instead of becoming a map of whatever size the ring allows.
func TestMetadataLimits(t *testing.T) {
	strict := testOptions()
	strict.MaxMetadataEntries = 4
	lax := testOptions()
	lax.MaxMetadataEntries = 1000
	server := newTransport(t, strict)
	ln := listen(t, server)

	client, _ := connect(t, server, ln)
	err := client.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Metadata: metadataOf(5)})
	if kernel.CodeOf(err) != kernel.ResourceExhausted || !errors.Is(err, kernel.ErrMetadataTooLarge) || !strings.Contains(err.Error(), "max_metadata_entries 4") {
		t.Fatalf("WriteFrame with 5 metadata entries: %v; want ResourceExhausted naming max_metadata_entries", err)
	}
	if client.Err() != nil {
		t.Fatalf("the refusal killed the connection: %v", client.Err())
	}

	laxClient, accepted := connect(t, newTransport(t, lax), ln)
	send(t, laxClient, &kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Metadata: metadataOf(5)}, nil)
	f, err := accepted.ReadFrame(timeout(t, 5*time.Second))
	if err == nil {
		f.Release()
		t.Fatal("a frame over the reader's metadata limit was delivered")
	}
	if !errors.Is(err, kernel.ErrMetadataTooLarge) {
		t.Fatalf("ReadFrame: %v; want an error wrapping ErrMetadataTooLarge", err)
	}
	select {
	case <-accepted.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the connection that carried it is still alive")
	}
}
