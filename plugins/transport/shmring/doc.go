// Package shmring is the shm-ring transport: calls between processes on
// the same Linux host through shared memory, without copying payloads and
// usually without a system call. Its config name is "shm-ring"; the
// address is a Unix socket path ("/run/kernrpc/echo.sock", also written
// "shm-ring:///run/kernrpc/echo.sock"), "@name" for an abstract socket, or
// host:0 (the kernel's default address) for a fresh abstract name that the
// listener reports. On other systems the transport fails to build with an
// error saying it needs Linux.
//
//	transport:
//	  name: shm-ring
//	  options:
//	    ring_size: 4MiB
//
// Options and their defaults:
//
//	ring_size       4MiB   each of a client's two rings (requests, answers); a
//	                       power of two from 16KiB to 1GiB. A listener uses the
//	                       smaller of its own and the client's
//	max_frame_size  4MiB   largest frame length read or written; a longer
//	                       frame written is refused alone, with
//	                       ResourceExhausted
//	spin            50µs   longest a waiting side polls the ring before it
//	                       sleeps; at most 1ms, 0 never polls
//	wait_timeout    5s     how long a writer waits for room in a full ring
//	                       before its frame fails with ResourceExhausted; also
//	                       bounds a client's attach handshake on the server
//	                       (a dial is bounded by its context)
//	max_metadata_entries  256  metadata pairs one frame may carry; a frame
//	                       written with more is refused alone, with
//	                       ResourceExhausted; one read with more closes the
//	                       connection
//	max_metadata_bytes  64KiB  the same for the keys and values together
//	allow_uids      []     user ids, besides this process's own (effective)
//	                       one, allowed to attach (server) or to serve (client)
//
// # Attaching
//
// The server listens on the Unix socket (SOCK_SEQPACKET). For each client
// that connects it checks the peer's uid (SO_PEERCRED: the effective uid
// the peer had when it connected, compared with this process's effective
// uid), creates a segment in a memfd (no name in /dev/shm or anywhere;
// sealed, so the client cannot shrink it under the server), and passes
// the descriptor over the socket
// (SCM_RIGHTS). The client checks the server's uid, the segment's size and
// seals, maps it and says ready. From then on the socket carries only
// wake-ups, and it is the liveness channel: when either process exits or
// is killed, the system closes its end and the other side learns at once,
// fails what is pending, and unmaps the segment, which the system then
// frees: nothing is left behind, whatever killed whom. A socket file left
// by a killed server is replaced by the next Listen on that path; servers
// that start at once over it take turns (an flock on its directory), so
// that one listens and the others find it there.
//
// # Rings
//
// The segment holds two single-producer single-consumer rings, one per
// direction, their write and read indices on cache lines of their own.
// Records are 8-byte aligned and start with a word giving their size and
// kind, so a wrap marker always fits before the ring's end.
// docs/protocol.md describes the segment and the records byte by byte.
//
// Buffer lends space in the ring itself: the codec encodes the payload in
// place, WriteFrame writes the frame header in front of it, and the reader
// decodes the header and hands the payload out where it lies; it stays
// there until Frame.Release. Within a process, many goroutines write: each
// reserves its record, fills it without a lock, and records are published
// in ring order. A lent buffer that is still being filled when a later
// record is published is turned into padding and its space held back until
// its holder sends or recycles it, so one slow encoder never holds up the
// others. Sending it frees that space before waiting for room for a new
// record (the payload goes through the heap), so holders waiting for room
// cannot fill the ring between them. A frame larger than a
// quarter of the ring goes through in chunks, each copied in by the writer
// and out by the reader as soon as it lands, so a frame of any size up to
// max_frame_size passes through a ring of any size.
//
// A full ring makes the writer wait (polling, then asleep) for
// wait_timeout, then fail with status ResourceExhausted: a frame is never
// dropped. The connection stays usable. WriteFrameContext
// (kernel.ContextWriter) stops waiting sooner when its context ends, with
// the context's code (DeadlineExceeded or Canceled) and nothing of the
// frame delivered (a chunked frame given up on midway is aborted): the
// engine writes a call's request and a stream's messages so, and a
// deadline bounds the wait. A frame the reader still lends
// out (a handler reading its request in place) does not hold the writer
// up: when the writer runs short of space, the reader lists such records
// in the segment and the writer skips them until they are released.
//
// # Waking up
//
// A side that finds nothing to read polls for up to spin, yielding its
// core between polls to any thread queued for it (on two cores, that is
// often the peer it waits for); while every P of its process polls, it
// yields its P too, so that the process's other goroutines do not wait
// for a poll to end. Then it declares in a word of the segment
// that it naps: a futex wait of at most 1ms, which the writer ends with
// one FUTEX_WAKE (at most four readers of a process nap at once, since a
// nap holds an OS thread). A nap the writer does not end becomes a sleep:
// the word says so and the goroutine parks. A writer sends a one-byte
// wake-up over the socket only when it finds that declaration, so a busy
// pair of processes exchanges calls without any system call. The
// goroutine watching the socket, parked in the netpoller, passes the
// wake-up on: a connection waiting for its peer, however long, holds no
// OS thread, and costs one descriptor (the socket) and one goroutine
// besides its reader. The polling adapts: when the peer usually takes
// longer than spin to answer, a waiting side only glances at the ring
// before it sleeps, and goes back to polling when answers come quickly
// again.
//
// # Short connections
//
// Attaching costs more than a TCP connect: the server creates, seals and
// maps a memfd and passes it over the socket, the client checks and maps
// it, and both unmap it at the end, which on a machine of several cores
// means a TLB shootdown on each side (some 25-60 µs in a VM). In the
// harness's short mode (a client per call) shm-ring did 2.5k calls/s at
// 1 caller against tcp-lv's 4.0k, with 295 µs of client CPU a call
// against 176 (benchmarks/results/2026-12-06T00-39-41Z.md); on another
// VM, where unmapping cost more, 909 against 4.4k (2026-12-06T03-10-43Z).
// Keep shm-ring connections long: a client shared by its callers, as the
// engine's pools make it.
//
// # Trust
//
// The peer can write anything into the shared memory at any time. Every
// index and record read from it is checked before use (a record must lie
// within what was published and within the ring, with its zero bytes
// zero, a frame or chunk record within a quarter of the ring, a frame
// within its record, a chunked frame within max_frame_size), each field
// is read once, and frame headers are decoded from a private copy. A bad
// record closes that connection only, with the reason logged.
package shmring
