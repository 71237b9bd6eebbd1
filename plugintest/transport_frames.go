package plugintest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// frames checks that frames of every size and type cross intact and that
// one call's frames keep their order.
func (e *transportEnv) frames(t tb) {
	maxPayload := e.maxPayload(transportSample(nil, 1, 0, 0))
	sizes := []struct {
		name string
		n    int
	}{
		{"0B", 0}, {"1B", 1}, {"1KiB", 1 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"Max", maxPayload},
	}
	for _, size := range sizes {
		t.Run(size.name, func(t tb) {
			if size.n > maxPayload {
				t.Skipf("a %s payload does not fit the maximum frame size %d (largest payload: %d bytes)", size.name, e.max, maxPayload)
			}
			p := e.pair(t)
			for i, dir := range []struct {
				name     string
				from, to kernel.Conn
			}{{"client→server", p.client, p.server}, {"server→client", p.server, p.client}} {
				want := transportSample(nil, uint64(i+1), 0, size.n)
				got := e.transfer(t, dir.from, dir.to, want)
				if d := transportDiff(got, want); d != "" {
					t.Errorf("%s frame with a %d-byte payload arrived changed: %s; the transport must deliver every header field and payload byte as written", dir.name, size.n, d)
				}
				got.Release()
			}
		})
	}
	t.Run("Sizes", e.frameSizes)
	t.Run("MaxLargeHeader", e.maxLargeHeader)
	t.Run("Widths", e.frameWidths)
	t.Run("Strings", e.frameStrings)
	t.Run("Types", e.frameTypes)
	t.Run("InOrder", e.inOrder)
	t.Run("ReusedFrame", e.reusedFrame) // transport_reuse.go
	t.Run("MetadataLimits", e.metadataLimits)
}

// frameTypes sends every type the kernel hands a transport, each with the
// fields it carries, and a frame with no fields at all.
func (e *transportEnv) frameTypes(t tb) {
	p := e.pair(t)
	frames := []kernel.Frame{
		{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1, Method: "/svc.S/M", Codec: "json", Timeout: 2500 * time.Microsecond, Metadata: kernel.Metadata{"trace-id": "abc", "empty": ""}, Payload: []byte("request")},
		{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream | kernel.FlagRetryable, CallID: 1, Codec: "json", Code: kernel.Unavailable, Message: "try elsewhere", Metadata: kernel.Metadata{"server": "a"}, Payload: []byte("response")},
		{Type: kernel.FrameCancel, CallID: 1<<64 - 1},
		{Type: kernel.FrameGoAway, Message: "draining"},
		{Type: kernel.FrameStreamData, Flags: kernel.FlagStream, CallID: 2, Payload: []byte("stream message")},
		{Type: kernel.FrameWindowUpdate, CallID: 2, Credit: 1<<32 - 1},
		{Type: kernel.FrameResponse},
	}
	for i := range frames {
		want := &frames[i]
		got := e.transfer(t, p.client, p.server, want)
		if d := transportDiff(got, want); d != "" {
			t.Errorf("%v frame %d arrived changed: %s; every frame type must cross with all its fields", want.Type, i, d)
		}
		got.Release()
	}
}

// inOrder writes one call's frames back to back, small and large mixed,
// while the peer reads them.
func (e *transportEnv) inOrder(t tb) {
	const n = 100
	p := e.pair(t)
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = (i * 997) % 3000
		if i%10 == 9 {
			// Large ones take another write path in some transports.
			sizes[i] = e.capped(70 << 10)
		}
	}
	werr := make(chan error, 1)
	transportGo(t, func() {
		for i, size := range sizes {
			if err := p.client.WriteFrame(transportSample(p.client, 7, i, size)); err != nil {
				werr <- errors.New("WriteFrame of frame " + strconv.Itoa(i) + ": " + err.Error())
				return
			}
		}
		werr <- nil
	})
	for i := range sizes {
		got := e.recv(t, p.server)
		if seq := got.Metadata["seq"]; seq != strconv.Itoa(i) {
			got.Release()
			t.Fatalf("frame %d of %d written back to back on call 7 arrived as frame %s (by its metadata); frames of one call must arrive in the order written", i, n, seq)
		}
		d := transportDiff(got, transportSample(nil, 7, i, sizes[i]))
		got.Release()
		if d != "" {
			t.Fatalf("frame %d of %d written back to back on call 7 arrived changed: %s", i, n, d)
		}
	}
	if err := <-werr; err != nil {
		t.Errorf("%v", err)
	}
}

// concurrentCalls runs many calls over one connection at once: each client
// goroutine writes its call's frames, and the server echoes every call
// from a goroutine of its own.
func (e *transportEnv) concurrentCalls(t tb) {
	const calls, perCall = 64, 8
	p := e.pair(t)
	size := func(call uint64, seq int) int {
		if seq == perCall-1 && call%8 == 0 {
			return e.capped(40 << 10)
		}
		return int(call*131+uint64(seq)*577) % 2048
	}
	ctx, cancel := context.WithTimeout(t.Context(), e.patience)
	defer cancel()

	var (
		mu       sync.Mutex
		firstErr string
	)
	report := func(msg string) {
		mu.Lock()
		if firstErr == "" {
			firstErr = msg
		}
		mu.Unlock()
		cancel()
	}

	// Server: one reader hands each frame to its call's echoing goroutine.
	var workers sync.WaitGroup
	queues := make(map[uint64]chan *kernel.Frame, calls)
	for call := uint64(1); call <= calls; call++ {
		q := make(chan *kernel.Frame, perCall)
		queues[call] = q
		workers.Go(func() {
			defer transportCatch(t)
			for f := range q {
				echo := transportHeader(f)
				echo.Payload = append(p.server.Buffer(len(f.Payload)), f.Payload...)
				err := p.server.WriteFrame(echo)
				f.Release() // after the write: echo shares f's metadata
				if err != nil {
					report("server WriteFrame of an echo: " + err.Error())
					return
				}
			}
		})
	}
	workers.Go(func() {
		defer transportCatch(t)
		defer func() {
			for _, q := range queues {
				close(q)
			}
		}()
		for range calls * perCall {
			f, err := transportRead(ctx, p.server)
			if err != nil {
				report("server ReadFrame: " + err.Error())
				return
			}
			q, ok := queues[f.CallID]
			if !ok {
				report("the server received a frame for call " + strconv.FormatUint(f.CallID, 10) + ", which no client goroutine wrote")
				f.Release()
				return
			}
			q <- f
		}
	})

	// Clients: one goroutine per call writes its frames.
	for call := uint64(1); call <= calls; call++ {
		workers.Go(func() {
			defer transportCatch(t)
			for seq := range perCall {
				if err := p.client.WriteFrame(transportSample(p.client, call, seq, size(call, seq))); err != nil {
					report("client WriteFrame: " + err.Error())
					return
				}
			}
		})
	}

	// The client reads every echo and checks each call's own sequence.
	next := make(map[uint64]int, calls)
	for range calls * perCall {
		r := e.readWithin(t, ctx, p.client)
		if r.err != nil {
			report("client ReadFrame: " + r.err.Error())
			break
		}
		call := r.f.CallID
		seq := next[call]
		if call == 0 || call > calls || seq >= perCall {
			report("the client received an extra frame for call " + strconv.FormatUint(call, 10) + " (metadata seq " + strconv.Quote(r.f.Metadata["seq"]) + ")")
			r.f.Release()
			break
		}
		if d := transportDiff(r.f, transportSample(nil, call, seq, size(call, seq))); d != "" {
			report("echo " + strconv.Itoa(seq) + " of call " + strconv.FormatUint(call, 10) + " (metadata seq " + strconv.Quote(r.f.Metadata["seq"]) + "): " + d)
			r.f.Release()
			break
		}
		next[call] = seq + 1
		r.f.Release()
	}
	if _, ok := transportDo(t, e.patience, func() struct{} { workers.Wait(); return struct{}{} }); !ok {
		t.Errorf("the server's readers and writers did not finish within %s", e.patience)
	}
	mu.Lock()
	defer mu.Unlock()
	if firstErr != "" {
		t.Fatalf("%d calls of %d frames each over one connection: %s; concurrent calls must each get their own frames, in order", calls, perCall, firstErr)
	}
}
