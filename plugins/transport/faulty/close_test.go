package faulty

import (
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// racingConn is an inner connection whose Err, once armed, reports that
// the write about to be delayed found the connection alive, and then
// waits until the test has closed the wrapper: the write and Close race.
type racingConn struct {
	kernel.Conn
	checked, closed chan struct{}
	armed           bool

	mu       sync.Mutex
	dead     bool
	recycled [][]byte
}

func (r *racingConn) Err() error {
	r.mu.Lock()
	armed, dead := r.armed, r.dead
	r.armed = false
	r.mu.Unlock()
	if armed {
		close(r.checked)
		<-r.closed
		return nil // looked before Close
	}
	if dead {
		return kernel.ErrClosed
	}
	return nil
}

func (r *racingConn) Close() error {
	r.mu.Lock()
	r.dead = true
	r.mu.Unlock()
	return nil
}

func (r *racingConn) Recycle(b []byte) {
	r.mu.Lock()
	r.recycled = append(r.recycled, b)
	r.mu.Unlock()
}

func (r *racingConn) RemoteAddr() string { return "racing peer" }

// A delayed frame written while Close runs is either sent or given back
// to the wrapped transport: Close gives back what is held when it ends,
// so a frame held after that would keep its payload (over shm-ring, ring
// space and with it the whole mapping) for ever.
func TestAFrameDelayedWhileClosingIsGivenBack(t *testing.T) {
	o := DefaultOptions()
	o.Delay = kernel.Duration(time.Hour)
	inner := &racingConn{checked: make(chan struct{}), closed: make(chan struct{}), armed: true}
	w := newConn(inner, newFaults(o, dialStream, 1), slog.New(slog.DiscardHandler))
	payload := []byte("payload")
	written := make(chan error, 1)
	go func() { written <- w.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Payload: payload}) }()
	<-inner.checked
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	close(inner.closed)
	if err := <-written; err != nil && !errors.Is(err, kernel.ErrClosed) {
		t.Errorf("WriteFrame racing Close: %v; want nil or an error wrapping ErrClosed", err)
	}
	inner.mu.Lock()
	defer inner.mu.Unlock()
	if len(inner.recycled) != 1 || &inner.recycled[0][0] != &payload[0] {
		t.Fatalf("the wrapped connection got %d buffers back after a write raced Close; want the frame's payload once, or it is never given back", len(inner.recycled))
	}
	w.dmu.Lock()
	defer w.dmu.Unlock()
	if len(w.held) != 0 {
		t.Fatalf("%d frames still held after Close", len(w.held))
	}
}
