package tcplv

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/kernel"
)

// TestBadInputClosesTheConnectionWithAClearError: whatever a peer sends,
// ReadFrame returns an error that says what was wrong and wraps the
// sentinel callers branch on, and the connection is dead afterwards.
func TestBadInputClosesTheConnectionWithAClearError(t *testing.T) {
	valid := encode(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1, Method: "Echo.Say", Payload: []byte("hi")})
	with := func(offset int, b byte) []byte {
		w := bytes.Clone(valid)
		w[offset] = b
		return w
	}
	cases := []struct {
		name     string
		wire     []byte
		thenEOF  bool
		want     error
		contains string
	}{
		{"length over the maximum", []byte{0xff, 0xff, 0xff, 0xf0}, false, kernel.ErrFrameTooLarge, "exceeds the maximum frame size"},
		{"length shorter than the fixed header", []byte{0, 0, 0, 5}, false, kernel.ErrMalformedFrame, "shorter than the fixed header"},
		{"bad magic", with(4, 'G'), false, kernel.ErrMalformedFrame, "bad magic"},
		{"unknown version", with(5, 2), false, kernel.ErrMalformedFrame, "unsupported protocol version 2"},
		{"unknown frame type", with(6, 42), false, kernel.ErrMalformedFrame, "unknown frame type 42"},
		{"frame type zero", with(6, 0), false, kernel.ErrMalformedFrame, "unknown frame type 0"},
		{"fields length past the frame end", with(4+15, 200), false, kernel.ErrMalformedFrame, "runs past the frame end"},
		{"field past the fields section", with(4+kernel.FrameFixedLen+1, 100), false, kernel.ErrMalformedFrame, "runs past the fields section"},
		{"truncated length prefix, then close", valid[:2], true, kernel.ErrPeerGone, "middle of a frame"},
		{"truncated body, then close", valid[:len(valid)-1], true, kernel.ErrPeerGone, "middle of a frame"},
		{"close between frames", nil, true, kernel.ErrPeerGone, "closed the connection"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, server := rawPair(t, testOptions())
			raw.Write(tc.wire)
			if tc.thenEOF {
				raw.Close()
			}
			f, err := server.ReadFrame(timeout(t, 5*time.Second))
			if err == nil {
				t.Fatalf("ReadFrame returned a %v frame, want an error", f.Type)
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.contains) || !strings.HasPrefix(err.Error(), "tcp-lv: ") {
				t.Fatalf("ReadFrame: %q, want a tcp-lv error wrapping %q and containing %q", err, tc.want, tc.contains)
			}
			select {
			case <-server.Done():
			case <-time.After(time.Second):
				t.Fatal("the connection is still alive")
			}
			if !errors.Is(server.Err(), tc.want) {
				t.Fatalf("Err: %v, want it to wrap %v", server.Err(), tc.want)
			}
			if !tc.thenEOF {
				// We hung up: the peer sees the socket close.
				raw.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := raw.Read(make([]byte, 1)); err != io.EOF {
					t.Fatalf("peer read %v, want EOF", err)
				}
			}
		})
	}
}

// TestLengthOverTheMaximumClosesOnlyThatConnectionAndAllocatesNothingForIt
// sends a frame claiming almost 4 GiB on one connection while another
// connection to the same listener keeps working.
func TestLengthOverTheMaximumClosesOnlyThatConnectionAndAllocatesNothingForIt(t *testing.T) {
	var logged syncbuf.Buffer
	o := testOptions()
	o.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	tr := newTransport(t, o)
	ln := listen(t, tr)
	good := dial(t, tr, ln.Addr())
	goodServer := accept(t, ln)
	raw, err := net.Dial("tcp", ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	bad := accept(t, ln)

	raw.Write([]byte{0xff, 0xff, 0xff, 0xf0})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = bad.ReadFrame(timeout(t, 5*time.Second))
	runtime.ReadMemStats(&after)
	if !errors.Is(err, kernel.ErrFrameTooLarge) {
		t.Fatalf("ReadFrame: %v, want ErrFrameTooLarge", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 256<<10 {
		t.Fatalf("rejecting a frame of 0xFFFFFFF0 bytes allocated %d bytes", n)
	}
	log := logged.String()
	if !strings.Contains(log, "frame too large") || !strings.Contains(log, bad.RemoteAddr()) {
		t.Errorf("the reason was not logged with the peer's address; log:\n%s", log)
	}

	if err := good.WriteFrame(&kernel.Frame{Type: kernel.FrameRequest, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	f, err := goodServer.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("the other connection died too: %v", err)
	}
	f.Release()
	if err := goodServer.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, CallID: 1}); err != nil {
		t.Fatal(err)
	}
	if f, err = good.ReadFrame(timeout(t, 5*time.Second)); err != nil {
		t.Fatalf("the other connection died too: %v", err)
	}
	f.Release()
}
