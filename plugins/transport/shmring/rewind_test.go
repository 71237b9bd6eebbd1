//go:build linux

package shmring

import (
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// The writer goes back to the ring's start once it is past hotWindow and
// the reader has released everything, so that both sides keep touching the
// same pages; while the reader lags it looks at the tail for that only
// once per rewindRecheck bytes, not on every record.

// rewindPeer is the reader's side played by hand: it releases or keeps
// what the connection writes.
type rewindPeer struct {
	t   *testing.T
	r   *rawConn
	out ringView
}

func newRewindPeer(t *testing.T) *rewindPeer {
	o := testOptions()
	o.RingSize = 1 << 20
	r := newRawConn(t, newTransport(t, o))
	t.Cleanup(r.close)
	return &rewindPeer{t: t, r: r, out: r.seg.ring(serverToClient)}
}

// write sends a frame of n payload bytes and returns the ring offset where
// the record published last ends.
func (p *rewindPeer) write(n int) uint64 {
	p.t.Helper()
	if err := p.r.c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1, Payload: make([]byte, n)}); err != nil {
		p.t.Fatalf("WriteFrame: %v", err)
	}
	return p.out.head.Load() % uint64(len(p.out.data))
}

func (p *rewindPeer) releaseAll() { p.out.tail.Store(p.out.head.Load()) }

func TestTheWriterRewindsARingItsReaderEmptied(t *testing.T) {
	p := newRewindPeer(t)
	for i := range 400 {
		end := p.write(1000)
		p.releaseAll()
		if end > hotWindow+2*1024 {
			t.Fatalf("record %d ends at offset %d: the writer went past hotWindow (%d) although the reader released every record", i, end, hotWindow)
		}
	}
}

func TestTheWriterLooksForAnEmptyRingOncePerRecheck(t *testing.T) {
	p := newRewindPeer(t)
	var end uint64
	for end <= hotWindow {
		end = p.write(1000) // kept: the ring is not empty
	}
	// Past hotWindow, with records held: this write looked and found the
	// ring in use.
	looked := p.write(1000)
	p.releaseAll()
	if got := p.write(1000); got < looked {
		t.Fatalf("the record after a failed look started again at the ring's start (ends at %d): the writer looked at the tail on the next record, not %d bytes later", got, rewindRecheck)
	}
	for range rewindRecheck / 1000 {
		p.releaseAll()
		if got := p.write(1000); got < looked {
			return
		}
	}
	t.Fatalf("the writer never went back to the ring's start %d bytes after its look, with the ring empty", rewindRecheck)
}
