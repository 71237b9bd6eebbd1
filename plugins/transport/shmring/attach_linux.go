package shmring

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The attach handshake runs over the Unix socket (SOCK_SEQPACKET, so each
// message arrives whole). Every message starts with the same 16 bytes:
//
//	0   [8]byte  magic "KRPCSHM1"
//	8   uint32   type
//	12  uint32   protocol version (2)
//
// then, in the host's byte order:
//
//	hello   client → server  uint64 ring size the client proposes
//	welcome server → client  uint64 ring size chosen; the segment's memfd
//	                         travels with it (SCM_RIGHTS)
//	refuse  either way       the reason, as text
//	ready   client → server  nothing: the client has mapped the segment
//
// The server checks the client's credentials (SO_PEERCRED) before it makes
// a segment, the client the server's before it maps one. After ready the
// socket carries only one-byte wake-ups (wake_linux.go): either side
// closing it (or dying) is the other's signal that the peer is gone.
const (
	msgHello   = 1
	msgWelcome = 2
	msgRefuse  = 3
	msgReady   = 4

	msgHeaderLen   = 16
	maxRefusalText = 512
)

func message(typ uint32, extra int) []byte {
	b := make([]byte, msgHeaderLen, msgHeaderLen+extra)
	copy(b, segmentMagic)
	ne.PutUint32(b[8:], typ)
	ne.PutUint32(b[12:], segmentVersion)
	return b
}

// parseMessage checks a message's header and returns its type and body.
func parseMessage(b []byte) (typ uint32, body []byte, err error) {
	if len(b) < msgHeaderLen || string(b[:8]) != segmentMagic {
		return 0, nil, errors.New("the peer does not speak the shm-ring attach protocol")
	}
	if v := ne.Uint32(b[12:]); v != segmentVersion {
		return 0, nil, fmt.Errorf("the peer speaks shm-ring version %d, this side %d", v, segmentVersion)
	}
	typ, body = ne.Uint32(b[8:]), b[msgHeaderLen:]
	if typ == msgRefuse {
		// Quoted: the text is the peer's, and goes into logs as it is.
		return 0, nil, fmt.Errorf("refused by the peer: %q", body[:min(len(body), maxRefusalText)])
	}
	return typ, body, nil
}

func refuse(uc *net.UnixConn, reason string) {
	uc.Write(append(message(msgRefuse, len(reason)), reason...))
}

// peerCred returns the credentials the kernel recorded for the socket's
// peer when it connected.
func peerCred(uc *net.UnixConn) (*unix.Ucred, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred, nil
}

func validRingSize(n uint64) bool {
	return n >= minRingSize && n <= maxRingSize && bits.OnesCount64(n) == 1
}

// attachServer runs the server's side of the handshake on a fresh socket.
func (t *transport) attachServer(uc *net.UnixConn, path string) (*conn, error) {
	cred, err := peerCred(uc)
	if err != nil {
		return nil, err
	}
	who := "pid " + strconv.Itoa(int(cred.Pid)) + " uid " + strconv.Itoa(int(cred.Uid))
	buf := make([]byte, 64)
	n, err := uc.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("%s: reading its hello: %w", who, err)
	}
	typ, body, err := parseMessage(buf[:n])
	if err == nil && (typ != msgHello || len(body) < 8) {
		err = fmt.Errorf("expected a hello, got message type %d of %d bytes", typ, n)
	}
	if err != nil {
		refuse(uc, err.Error())
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	if !t.allowed(cred.Uid) {
		reason := fmt.Sprintf("uid %d may not attach to %s; the server allows uids %v (option allow_uids)", cred.Uid, path, t.allowUIDs)
		refuse(uc, reason)
		return nil, fmt.Errorf("%s: %s", who, reason)
	}
	proposed := ne.Uint64(body)
	if !validRingSize(proposed) {
		reason := fmt.Sprintf("proposed ring size %d is not a power of two between 16KiB and 1GiB", proposed)
		refuse(uc, reason)
		return nil, fmt.Errorf("%s: %s", who, reason)
	}
	ringSize := int(min(proposed, uint64(t.ringSize)))
	seg, fd, err := createSegment(ringSize, int32(os.Getpid()), cred.Pid)
	if err != nil {
		refuse(uc, "the server could not create a segment")
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	welcome := ne.AppendUint64(message(msgWelcome, 8), uint64(ringSize))
	_, _, err = uc.WriteMsgUnix(welcome, unix.UnixRights(fd), nil)
	// The descriptor in flight keeps the memfd alive until the client takes
	// it; ours is no longer needed.
	unix.Close(fd)
	if err == nil {
		if n, err = uc.Read(buf); err == nil {
			typ, _, err = parseMessage(buf[:n])
			if err == nil && typ != msgReady {
				err = fmt.Errorf("expected ready, got message type %d", typ)
			}
		}
	}
	if err != nil {
		seg.unmap()
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	// The handshake's deadline goes before the connection's watcher starts
	// reading the socket, which would take it passing for the peer gone.
	uc.SetDeadline(time.Time{})
	return newConn(t, uc, seg, true, path, path+" ("+who+")"), nil
}

// attachClient runs the client's side of the handshake on a dialed socket.
func (t *transport) attachClient(uc *net.UnixConn, path string) (*conn, error) {
	cred, err := peerCred(uc)
	if err != nil {
		return nil, err
	}
	if !t.allowed(cred.Uid) {
		reason := fmt.Sprintf("the server at %s runs as uid %d, which this client does not trust; it allows uids %v (option allow_uids)", path, cred.Uid, t.allowUIDs)
		refuse(uc, reason)
		return nil, errors.New(reason)
	}
	if _, err := uc.Write(ne.AppendUint64(message(msgHello, 8), uint64(t.ringSize))); err != nil {
		return nil, fmt.Errorf("sending hello: %w", err)
	}
	buf := make([]byte, msgHeaderLen+maxRefusalText)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		// A server that refuses says why first: one that says nothing
		// stopped, or is not a shm-ring server.
		return nil, fmt.Errorf("waiting for the segment: the server closed the socket without answering (it stopped, or does not serve shm-ring there): %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("waiting for the segment: %w", err)
	}
	fds, err := receivedFDs(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return nil, err
	}
	typ, body, err := parseMessage(buf[:n])
	switch {
	case err != nil:
		return nil, err
	case typ != msgWelcome || len(body) < 8:
		err = fmt.Errorf("expected the welcome, got message type %d of %d bytes", typ, n)
	case flags&unix.MSG_CTRUNC != 0 || len(fds) != 1:
		err = fmt.Errorf("the welcome came with %d file descriptors (truncated: %t), want the segment's one", len(fds), flags&unix.MSG_CTRUNC != 0)
	}
	if err != nil {
		refuse(uc, err.Error())
		return nil, err
	}
	ringSize := ne.Uint64(body)
	if !validRingSize(ringSize) || ringSize > uint64(t.ringSize) {
		err := fmt.Errorf("the server chose rings of %d bytes: want a power of two between 16KiB and the %d this client proposed", ringSize, t.ringSize)
		refuse(uc, err.Error())
		return nil, err
	}
	seg, err := mapSegment(fds[0], int(ringSize))
	if err != nil {
		refuse(uc, err.Error())
		return nil, err
	}
	if _, err := uc.Write(message(msgReady, 0)); err != nil {
		seg.unmap()
		return nil, fmt.Errorf("sending ready: %w", err)
	}
	uc.SetDeadline(time.Time{}) // before the watcher reads, as in attachServer
	return newConn(t, uc, seg, false, path, path), nil
}

// receivedFDs returns every descriptor in a control message, so that the
// caller closes them all, whatever it keeps.
func receivedFDs(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message with the segment: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err == nil {
			fds = append(fds, got...)
		}
	}
	return fds, nil
}
