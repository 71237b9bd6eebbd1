package faulty

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// A connection of a transport with some of the optional interfaces:
// every method the wrapper may forward answers with a mark, so that a
// test sees the call reach it.
type (
	plainConn struct{ kernel.Conn }
	buffers   struct{}
	queues    struct{}
	halfClose struct{}
)

var errQueued, errHalfClosed = errors.New("queued by the inner conn"), errors.New("closed by the inner conn")

func (plainConn) Err() error                    { return nil }
func (plainConn) Recycle([]byte)                {}
func (buffers) Buffered() int                   { return 7 }
func (queues) QueueFrame(f *kernel.Frame) error { return errQueued }
func (halfClose) CloseWrite() error             { return errHalfClosed }

// The wrapper offers exactly the optional interfaces of the connection it
// wraps, and each forwards to it: one it claimed without the inner's
// would panic on use, one it hid would cost the engine its fast paths.
func TestWrapperOffersWhatItWraps(t *testing.T) {
	p := plainConn{}
	for _, tc := range []struct {
		name    string
		inner   kernel.Conn
		b, q, h bool
	}{
		{"none", p, false, false, false},
		{"buffered", struct {
			plainConn
			buffers
		}{p, buffers{}}, true, false, false},
		{"queues", struct {
			plainConn
			queues
		}{p, queues{}}, false, true, false},
		{"half-closes", struct {
			plainConn
			halfClose
		}{p, halfClose{}}, false, false, true},
		{"buffered, queues", struct {
			plainConn
			buffers
			queues
		}{p, buffers{}, queues{}}, true, true, false},
		{"buffered, half-closes", struct {
			plainConn
			buffers
			halfClose
		}{p, buffers{}, halfClose{}}, true, false, true},
		{"queues, half-closes", struct {
			plainConn
			queues
			halfClose
		}{p, queues{}, halfClose{}}, false, true, true},
		{"all three", struct {
			plainConn
			buffers
			queues
			halfClose
		}{p, buffers{}, queues{}, halfClose{}}, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tr := &transport{o: o, log: slog.New(slog.DiscardHandler)}
			w := tr.wrap(tc.inner, dialStream, 1)
			b, hasB := w.(kernel.BufferedReader)
			q, hasQ := w.(kernel.FrameQueuer)
			h, hasH := w.(kernel.HalfCloser)
			if hasB != tc.b || hasQ != tc.q || hasH != tc.h {
				t.Fatalf("wrapper offers Buffered %t, QueueFrame %t, CloseWrite %t; want %t, %t, %t", hasB, hasQ, hasH, tc.b, tc.q, tc.h)
			}
			if hasB && b.Buffered() != 7 {
				t.Errorf("Buffered: %d; want the inner's 7", b.Buffered())
			}
			if hasQ {
				// No fault is on (DefaultOptions): the frame goes to the
				// inner QueueFrame as it is.
				if err := q.QueueFrame(&kernel.Frame{Type: kernel.FrameRequest}); !errors.Is(err, errQueued) {
					t.Errorf("QueueFrame: %v; want the inner's answer", err)
				}
			}
			if hasH {
				if err := h.CloseWrite(); !errors.Is(err, errHalfClosed) {
					t.Errorf("CloseWrite: %v; want the inner's answer", err)
				}
			}
		})
	}
}
