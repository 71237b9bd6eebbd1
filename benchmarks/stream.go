package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The stream mode: server streaming. A caller opens one stream per round
// with a single request naming a message size (and a count, 0 for no end),
// and the server sends messages of that size back as fast as flow control
// lets it, until the caller closes the stream when the round ends. A
// "call" of the round's loop is one message received, so the round's
// figures read per message: messages/s, the gap between two messages of a
// stream (its p99 shows stalls for credit; streamLoop times one in about
// gapStride), and allocations and CPU time
// per message on each side. The callers of a round share one client, as in
// the long mode: at 16 streams they are 16 streams on one connection.
//
// The systems that stream (kernrpc's, grpc-go) serve a method "Stream"
// beside Echo, and the protobuf floor streams on a connection of its own
// (floors_stream.go); net/rpc cannot stream, and the other bare ping-pongs
// have no stream counterpart, so they sit this mode out.

// streamMethod is kernrpc's name for the streaming method; grpc-go's is
// grpcStreamMethod.
const streamMethod = "Echo.Stream"

// streamClient is an echoClient whose system streams.
type streamClient interface {
	// openStream opens the streaming method, asking for count messages of
	// size payload bytes (0 for as many as the server can send until the
	// stream is closed).
	openStream(ctx context.Context, size, count int) (msgStream, error)
}

// msgStream is one open server stream, as the caller reads it.
type msgStream interface {
	// recv reads the next message and returns its payload's length; at
	// the end of a counted stream it returns io.EOF.
	recv() (int, error)
	// Close abandons the stream: the server's handler sees it cancelled.
	Close() error
}

// streamText is the request's text: "<size> <count>".
func streamText(size, count int) string { return strconv.Itoa(size) + " " + strconv.Itoa(count) }

// parseStreamText reads a request's text on the server, refusing what
// no harness sends: the size is bounded as -stream-sizes is.
func parseStreamText(text string) (size, count int, err error) {
	s, c, ok := strings.Cut(text, " ")
	size, err1 := strconv.Atoi(s)
	count, err2 := strconv.Atoi(c)
	if !ok || err1 != nil || err2 != nil || size < 0 || size > maxPayload || count < 0 {
		return 0, 0, fmt.Errorf("stream request %q: want \"<size> <count>\", a size from 0 to %d and a count of at least 0 (0: until the client closes)", text, maxPayload)
	}
	return size, count, nil
}

// sendStream sends the messages a stream request asked for with send, the
// same message every time (each send marshals it), until count is reached
// or send fails (the client closed the stream).
func sendStream(count int, send func() error) error {
	for i := 0; count == 0 || i < count; i++ {
		if err := send(); err != nil {
			return err
		}
	}
	return nil
}

// streamCaller is one caller of the stream mode: its first call opens the
// stream on cli, every call reads one message, and done closes the stream
// when the round is over. Opening happens in the warm-up, on the caller's
// goroutine, as a caller making a unary client would.
func streamCaller(cli streamClient, size int) (call callFunc, done func() error) {
	var st msgStream
	call = func(ctx context.Context) (int, error) {
		if st == nil {
			var err error
			if st, err = cli.openStream(ctx, size, 0); err != nil {
				return 0, fmt.Errorf("open the stream: %w", err)
			}
		}
		n, err := st.recv()
		if err != nil {
			return 0, fmt.Errorf("stream: %w", err)
		}
		return n, nil
	}
	done = func() error {
		if st == nil {
			return nil
		}
		return st.Close()
	}
	return call, done
}

// streamsIn reports whether s takes part in mode: every system does but
// in the stream mode, which only the systems that stream run.
func (s *system) streamsIn(mode string) bool { return mode != modeStream || s.streams }

// running lists the systems that run in at least one of the selected
// modes: net/rpc alone in a stream-only run does not.
func (o *options) running() []*system {
	var out []*system
	for _, s := range o.systems {
		if slices.ContainsFunc(o.modes, s.streamsIn) {
			out = append(out, s)
		}
	}
	return out
}

// errNoStream is a harness bug: a system marked as streaming whose client
// cannot open streams.
var errNoStream = errors.New("the system is marked as streaming but its client has no openStream")

// mibPerSec is a stream's payload rate in MiB/s.
func (r *result) mibPerSec(size int) float64 { return r.qps() * float64(size) / (1 << 20) }

// fmtMiB prints a rate in MiB/s.
func fmtMiB(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// streamNote is the results header's line on the stream mode's messages.
const streamNote = "- Streams: **kernrpc** (and kernrpc/shm-ring) opens the stream with `kernrpc.OpenServerStream` and reads it with the " +
	"typed `Recv`, a new `plainpb.Echo` per message, as grpc-go's generated client does; its server sends through " +
	"`kernrpc.HandleServerStream`. grpc-go: a hand-written `grpc.ServiceDesc` with a `StreamDesc{ServerStreams: true}` in the shape " +
	"protoc-gen-go-grpc generates, default options, `plainpb.Echo`. **kernrpc tuned** reads with `RecvMsg` into one reused " +
	"`echopb.Echo`. Every server sends one message over and over (each send marshals it); default stream and connection windows " +
	"(kernrpc 1 MiB and 16 MiB; grpc-go its defaults, with its BDP estimator).\n"

// streamSection writes the stream mode's tables: per message size, speed
// and cost per message, then the ratios.
func (b *benchmark) streamSection(w *strings.Builder, sizes []int) {
	const rowName = "streams"
	for _, p := range sizes {
		fmt.Fprintf(w, "### stream, %s messages\n\n", sizeName(p))
		w.WriteString("Messages/s (± half the spread between rounds) · MiB/s of payload · gap between two messages of a stream, " +
			"p50 / p99 in µs:\n\n")
		b.systemTable(w, modeStream, p, rowName, func(r *result) string {
			return fmt.Sprintf("%s %s · %s MiB/s · %s / %s", fmtQPS(r.qps()), fmtSpread(r), fmtMiB(r.mibPerSec(p)),
				fmtMicros(r.hist.quantile(0.5)), fmtMicros(r.hist.quantile(0.99)))
		})
		w.WriteString("Per message, client + server: heap allocations · CPU µs:\n\n")
		b.systemTable(w, modeStream, p, rowName, func(r *result) string {
			return fmt.Sprintf("%s + %s allocs · %s + %s µs",
				fmtAllocs(r.perCall(float64(r.client.mallocs))), fmtAllocs(r.perCall(float64(r.server.mallocs))),
				fmtCPU(r.perCall(micros(r.client.cpu))), fmtCPU(r.perCall(micros(r.server.cpu))))
		})
		b.logLine(w, modeStream, p)
	}
	pairs := b.ratioPairs()
	if len(pairs) == 0 {
		return
	}
	w.WriteString("### stream: ratios\n\n")
	w.WriteString("Above 1 is better for messages/s (at one message size, also the ratio of bytes/s), below 1 for the rest; " +
		"allocations and CPU per message count client + server, then the server alone.\n\n")
	t := table{header: []string{"systems", "message", rowName, "msgs/s", "p99 gap", "allocs/msg", "CPU/msg", "server CPU/msg"}}
	for _, pr := range pairs {
		s, peer := pr[0], pr[1]
		name := b.opts.systems[s].label + " / " + b.opts.systems[peer].label
		for _, c := range b.cells {
			kr, pr := b.results[c][s], b.results[c][peer]
			if c.mode != modeStream || kr == nil || pr == nil {
				continue
			}
			t.add(name, sizeName(c.payload), c.callersName(),
				fmtRatio(kr.qps(), pr.qps()),
				fmtRatio(float64(kr.hist.quantile(0.99)), float64(pr.hist.quantile(0.99))),
				fmtAllocRatio(kr.perCall(float64(kr.client.mallocs+kr.server.mallocs)), pr.perCall(float64(pr.client.mallocs+pr.server.mallocs))),
				fmtRatio(kr.perCall(float64(kr.client.cpu+kr.server.cpu)), pr.perCall(float64(pr.client.cpu+pr.server.cpu))),
				fmtRatio(kr.perCall(float64(kr.server.cpu)), pr.perCall(float64(pr.server.cpu))))
		}
	}
	if len(t.rows) > 0 {
		t.write(w)
	}
	b.streamTargets(w)
}

// streamTargets are the stream mode's goals against grpc-go, on the
// default path: messages/s at 16 B, bytes/s at 64 KiB, and over shm-ring
// more than over tcp-lv.
var streamTargets = []struct {
	system, what string
	size         int
	min          float64 // 0: more than kernrpc over tcp-lv in the same cell
}{
	{"kernrpc", "messages/s", 16, 3},
	{"kernrpc", "bytes/s", 64 << 10, 2},
	{"kernrpc-shm", "bytes/s", 64 << 10, 0},
}

// streamTargets writes, for the targets whose systems and cells ran, the
// ratio to grpc-go and whether it met its goal.
func (b *benchmark) streamTargets(w *strings.Builder) {
	g, tcp := b.systemIndex("grpc"), b.systemIndex("kernrpc")
	if g < 0 {
		return
	}
	var lines []string
	for _, tg := range streamTargets {
		s := b.systemIndex(tg.system)
		if s < 0 || (tg.min == 0 && tcp < 0) {
			continue
		}
		for _, c := range b.cells {
			if c.mode != modeStream || c.payload != tg.size {
				continue
			}
			got := b.results[c][s].qps() / b.results[c][g].qps()
			goal, want := fmt.Sprintf("≥ %.0f×", tg.min), tg.min
			if tg.min == 0 {
				want = b.results[c][tcp].qps() / b.results[c][g].qps()
				goal = fmt.Sprintf("> kernrpc's %.2f×", want)
			}
			verdict := "met"
			if got < want || (tg.min == 0 && got == want) {
				verdict = "**not met**"
			}
			floor := ""
			if c.callers == 1 && tg.system == "kernrpc" {
				// One stream is one TCP connection for the floor too.
				floor = b.floorNote(c, "bare-tcp-pb", g)
			}
			lines = append(lines, fmt.Sprintf("- %s / grpc-go, %s of %s messages, %s: %.2f× (target %s): %s%s\n",
				b.opts.systems[s].label, tg.what, sizeName(c.payload), streamsName(c.callers), got, goal, verdict, floor))
		}
	}
	if len(lines) > 0 {
		w.WriteString("Targets, default path against grpc-go:\n\n" + strings.Join(lines, "") + "\n")
	}
}

func streamsName(n int) string {
	if n == 1 {
		return "1 stream"
	}
	return strconv.Itoa(n) + " streams"
}
