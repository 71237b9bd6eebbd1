//go:build linux

package tcplv

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// rawSocket reads and writes a plain TCP connection's non-blocking socket
// with raw system calls, still waiting through the runtime's poller (and
// its deadlines) when the socket has nothing to read or no room to write.
//
// Why: net.Conn's Read and Write enter the scheduler's syscall state
// around every read(2) and write(2). When every P of the process was
// idle, as a client's are while it waits for its answers, entering that
// state wakes the runtime's monitor thread (sysmon), which then polls at
// 20 µs for a millisecond or more. A client calling a busy server went
// through that once a call: with 16 such processes on 2 cores, sysmon's
// wake-ups and sleeps took 28% of the clients' CPU (perf). A read or
// write of a non-blocking socket never blocks, so it needs no syscall
// state: cloudwego/netpoll, Kitex's network library, reads and writes
// the same way.
type rawSocket struct {
	rc syscall.RawConn

	// One read and one write at a time (the reading flag, wmu): their
	// arguments and results are fields so that the functions handed to rc
	// are made once, not once a call.
	rbuf    []byte
	rn      int
	rerr    error
	readFn  func(fd uintptr) bool
	wiov    []syscall.Iovec // what is left to write
	werr    error
	writeFn func(fd uintptr) bool
	iov     []syscall.Iovec // the segments' backing array, reused
	iovs    [2]syscall.Iovec

	// A write made with a context (ctx, set by the writer for one writev;
	// nil or Background for none) stops waiting for room once the context
	// ends: the first time it finds none, a context.AfterFunc is set to
	// cut the socket's write deadline (cut). Only a write that waits pays
	// for it. fired then says the context ended during the writev, and
	// rest holds a copy of what it had left to write when that ended it.
	ctx      context.Context
	cut      func(time.Time) error
	ctxStop  func() bool
	ctxFired chan struct{}
	fired    bool
	rest     []byte
}

// init readies s for nc; s.ok then reports whether nc can be read and
// written raw (a *net.TCPConn).
func (s *rawSocket) init(nc net.Conn) {
	sc, ok := nc.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	s.rc = rc
	s.cut = sc.SetWriteDeadline
	s.readFn = s.readOnce
	s.writeFn = s.writeOnce
	s.iov = s.iovs[:0]
}

func (s *rawSocket) ok() bool { return s.rc != nil }

func (s *rawSocket) readOnce(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.rbuf))), uintptr(len(s.rbuf)))
		switch e {
		case 0:
			s.rn, s.rerr = int(r), nil
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			s.rn, s.rerr = 0, os.NewSyscallError("read", e)
			return true
		}
	}
}

// read reads into p as net.Conn.Read does: io.EOF at the peer's end,
// os.ErrDeadlineExceeded (wrapped) at the read deadline.
func (s *rawSocket) read(p []byte) (int, error) {
	s.rbuf = p
	err := s.rc.Read(s.readFn)
	s.rbuf = nil
	switch {
	case err != nil:
		return 0, err
	case s.rerr != nil:
		return 0, s.rerr
	case s.rn == 0:
		return 0, io.EOF
	}
	raceIOEdge()
	return s.rn, nil
}

// maxIovecs is Linux's IOV_MAX: writev takes no more segments at once.
const maxIovecs = 1024

func (s *rawSocket) writeOnce(fd uintptr) bool {
	for len(s.wiov) > 0 {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.wiov))), uintptr(min(len(s.wiov), maxIovecs)))
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if s.ctx != nil && s.ctxStop == nil {
				s.watchCtx()
			}
			return false
		default:
			s.werr = os.NewSyscallError("writev", e)
			return true
		}
		if r == 0 {
			// No progress and no error: what net's writev reports so,
			// rather than trying again for ever.
			s.werr = io.ErrUnexpectedEOF
			return true
		}
		s.consume(int(r))
	}
	return true
}

// consume drops n written bytes from the front of wiov, whose segments
// are none of them empty.
func (s *rawSocket) consume(n int) {
	for n > 0 {
		v := &s.wiov[0]
		if l := int(v.Len); n < l {
			v.Base = (*byte)(unsafe.Add(unsafe.Pointer(v.Base), n))
			v.SetLen(l - n)
			return
		}
		n -= int(v.Len)
		s.wiov = s.wiov[1:]
	}
}

// writev writes every byte of bufs, as net.Buffers.WriteTo does.
func (s *rawSocket) writev(bufs ...[]byte) error {
	iov := s.iov[:0]
	for _, b := range bufs {
		if len(b) > 0 {
			v := syscall.Iovec{Base: unsafe.SliceData(b)}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
	}
	s.wiov, s.werr = iov, nil
	raceIOEdge()
	err := s.rc.Write(s.writeFn)
	if err == nil {
		err = s.werr
	}
	s.fired = false
	if s.ctxStop != nil {
		s.unwatchCtx()
		if s.fired && errors.Is(err, os.ErrDeadlineExceeded) {
			s.rest = s.copyRest()
		}
	}
	s.wiov = nil
	clear(iov) // the buffers go back to their pool: keep no reference
	s.iov = iov
	return err
}

// watchCtx has the end of ctx cut the write waiting for room short.
func (s *rawSocket) watchCtx() {
	if s.ctx.Done() == nil {
		return // WriteFrame's: it never ends
	}
	fired := make(chan struct{})
	s.ctxFired = fired
	s.ctxStop = context.AfterFunc(s.ctx, func() {
		s.cut(aLongTimeAgo)
		close(fired)
	})
}

// unwatchCtx ends watchCtx's watch, and sets fired if ctx cut the socket's
// deadline: the caller must then set it again.
func (s *rawSocket) unwatchCtx() {
	if !s.ctxStop() {
		<-s.ctxFired // the cut is made before the caller restores the deadline
		s.fired = true
	}
	s.ctxStop, s.ctxFired = nil, nil
}

// copyRest copies what wiov has left into one buffer.
func (s *rawSocket) copyRest() []byte {
	n := 0
	for _, v := range s.wiov {
		n += int(v.Len)
	}
	rest := make([]byte, 0, n)
	for _, v := range s.wiov {
		rest = append(rest, unsafe.Slice(v.Base, v.Len)...)
	}
	return rest
}
