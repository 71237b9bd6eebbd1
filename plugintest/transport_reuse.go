package plugintest

import (
	"strconv"

	"github.com/kernrpc/kernrpc/kernel"
)

// reusedFrame writes frames both ways from one kernel.Frame, which the
// writer resets and fills with other values as soon as each WriteFrame
// returns, then writes a fresh frame after it: the engine sends all of a
// stream's messages from one Frame, and an attempt's request from a
// pooled one, so a transport that keeps f (queues the pointer, encodes it
// later) sends what the Frame holds by then. Each frame must arrive as it
// was when written, and the fresh one after it.
func (e *transportEnv) reusedFrame(t tb) {
	p := e.pair(t)
	sizes := []int{0, 100, 1500, e.capped(70 << 10)}
	for d, dir := range []struct {
		name     string
		from, to kernel.Conn
	}{{"client→server", p.client, p.server}, {"server→client", p.server, p.client}} {
		call := uint64(20 + 2*d)
		wrote := make(chan string, 1)
		panicked := transportGo(t, func() {
			var f kernel.Frame // reused, as the engine reuses a stream's
			for i, size := range sizes {
				want := transportSample(nil, call, i, size)
				f = *transportHeader(want)
				f.Payload = append(dir.from.Buffer(size), want.Payload...)
				if err := dir.from.WriteFrame(&f); err != nil {
					wrote <- "WriteFrame of frame " + strconv.Itoa(i) + ": " + err.Error()
					return
				}
				// The payload is the transport's now: only the Frame's
				// own fields are refilled.
				f.Reset()
				f.Type, f.CallID, f.Method, f.Message = kernel.FrameCancel, 1<<40, "plugintest: overwritten", "plugintest: overwritten"
				f.Metadata = kernel.Metadata{"seq": "overwritten"}
				if err := dir.from.WriteFrame(transportSample(dir.from, call+1, i, 10)); err != nil {
					wrote <- "WriteFrame of the fresh frame after frame " + strconv.Itoa(i) + ": " + err.Error()
					return
				}
			}
			wrote <- ""
		})
		for i, size := range sizes {
			for _, want := range []*kernel.Frame{transportSample(nil, call, i, size), transportSample(nil, call+1, i, 10)} {
				got := e.recv(t, dir.to)
				diff := transportDiff(got, want)
				got.Release()
				switch {
				case diff == "":
				case want.CallID == call:
					t.Fatalf("%s: frame %d (a %d-byte payload), written from a kernel.Frame the writer reset and refilled once WriteFrame "+
						"returned, arrived changed: %s; WriteFrame does not keep f after it returns (the engine sends every message of a "+
						"stream from one Frame): encode or copy the header, and keep only the payload, before returning", dir.name, i, size, diff)
				default:
					t.Fatalf("%s: the fresh frame written after frame %d arrived changed: %s", dir.name, i, diff)
				}
			}
		}
		select {
		case err := <-wrote:
			if err != "" {
				t.Fatalf("%s: %s", dir.name, err)
			}
		case <-panicked:
			return // transportCatch failed t
		}
	}
}
