//go:build linux

package shmring

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
)

// A server trusts nothing a client sends before it attaches: whatever is
// not a hello it can take gets a refusal saying why, a closed socket and a
// WARN with the reason, and the server attaches the next client as
// before. A client that hangs up without a word (its dial given up by its
// caller, say) is routine: the reason is logged at DEBUG.
func TestServerRefusesABadHello(t *testing.T) {
	otherVersion := message(msgHello, 8)
	ne.PutUint32(otherVersion[12:], segmentVersion+1)
	for _, tc := range []struct {
		name  string
		hello []byte // nil: hang up without a word
		want  string
		level string
	}{
		{"not the protocol", []byte("GET / HTTP/1.1\r\n\r\n"), "the peer does not speak the shm-ring attach protocol", "level=WARN"},
		{"another version", ne.AppendUint64(otherVersion, 64<<10), "the peer speaks shm-ring version", "level=WARN"},
		{"ready instead of hello", message(msgReady, 0), "expected a hello, got message type 4 of 16 bytes", "level=WARN"},
		{"hello without a ring size", message(msgHello, 0), "expected a hello, got message type 1 of 16 bytes", "level=WARN"},
		{"ring size not a power of two", ne.AppendUint64(message(msgHello, 8), 12345), "proposed ring size 12345 is not a power of two", "level=WARN"},
		{"hangs up at once", nil, "reading its hello: EOF", "level=DEBUG"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncbuf.Buffer
			o := testOptions()
			o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			tr := newTransport(t, o)
			ln := listen(t, tr)
			uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: ln.Addr(), Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			defer uc.Close()
			uc.SetDeadline(time.Now().Add(10 * time.Second))
			if tc.hello == nil {
				uc.Close()
			} else {
				if _, err := uc.Write(tc.hello); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 1024)
				n, err := uc.Read(buf)
				if err != nil {
					t.Fatalf("reading the server's answer: %v; want a refusal", err)
				}
				if _, _, err := parseMessage(buf[:n]); err == nil || !strings.Contains(err.Error(), "refused by the peer") || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("the server answered %v; want a refusal saying %q", err, tc.want)
				}
				if n, err := uc.Read(buf); n != 0 || err == nil {
					t.Errorf("after the refusal the socket gave %d bytes, %v; want it closed", n, err)
				}
			}
			waitFor(t, "a log line saying "+tc.want, func() bool { return strings.Contains(logs.String(), tc.want) })
			if out := logs.String(); !strings.Contains(out, tc.level) || !strings.Contains(out, "client not attached") {
				t.Errorf("log %q; want a line at %s that the client was not attached", out, tc.level)
			}
			c, s := connect(t, tr, ln)
			c.Close()
			s.Close()
		})
	}
}

// A client whose server hangs up during the handshake, or answers in
// another version of it, fails Dial saying so.
func TestClientNamesAFailedWelcome(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(uc *net.UnixConn)
		want   string
	}{
		{"server hangs up", func(uc *net.UnixConn) { uc.Close() }, "the server closed the socket without answering"},
		{"another version", func(uc *net.UnixConn) {
			m := message(msgWelcome, 8)
			ne.PutUint32(m[12:], segmentVersion+1)
			uc.Write(ne.AppendUint64(m, 64<<10))
		}, "the peer speaks shm-ring version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := fakeServer(t, func(uc *net.UnixConn, _ uint64) { tc.answer(uc) })
			tr := newTransport(t, testOptions())
			c, err := tr.Dial(timeout(t, 10*time.Second), addr)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), addr) {
				t.Errorf("Dial: %v; want it to name %s and say %q", err, addr, tc.want)

			}
		})
	}
}
