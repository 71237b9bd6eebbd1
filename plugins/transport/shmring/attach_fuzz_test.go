//go:build linux

package shmring

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParseMessage reads any bytes as a message of the attach handshake
// from a peer. It returns a type and the bytes after the header, or an
// error; a refusal's text comes back quoted and cut at maxRefusalText, so
// a peer can put neither control characters nor an unbounded text into
// this side's logs.
func FuzzParseMessage(f *testing.F) {
	f.Add(message(msgHello, 8))
	f.Add(append(message(msgRefuse, 5), "nope\n"...))
	f.Add(append(message(msgRefuse, 600), bytes.Repeat([]byte{0x1b}, 600)...))
	f.Add([]byte("KRPCSHM1"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, body, err := parseMessage(b)
		if err != nil {
			if typ != 0 || body != nil {
				t.Fatalf("error %v with type %d and %d bytes of body", err, typ, len(body))
			}
			if msg := err.Error(); strings.ContainsFunc(msg, func(r rune) bool { return r < ' ' || r == 0x7f }) || len(msg) > 4*maxRefusalText+100 {
				t.Fatalf("error of %d bytes holding control characters or too long: %q", len(msg), msg)
			}
			return
		}
		if len(b) < msgHeaderLen || !bytes.Equal(b[msgHeaderLen:], body) || typ == msgRefuse {
			t.Fatalf("%q parsed as type %d, body %q", b, typ, body)
		}
	})
}
