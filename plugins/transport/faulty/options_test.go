package faulty_test

import (
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/transport/faulty"
)

// An option New refuses is named once, with what was wrong and what is
// allowed, in the kernel's one shape for plugin errors.
func TestBadOptionsAreNamed(t *testing.T) {
	for _, c := range []struct {
		options map[string]any
		want    string
	}{
		{map[string]any{"side": "server"}, `transport "faulty": option "side": is "server"; want dial, listen or both`},
		{map[string]any{"drop": 1.5}, `option "drop": is a probability per frame, from 0 to 1; got 1.5`},
		{map[string]any{"duplicate": -0.1}, `option "duplicate": is a probability`},
		{map[string]any{"frames": []any{"ping"}}, `option "frames": has "ping"; want some of cancel, goaway, request, response`},
		{map[string]any{"frames": []any{}}, `option "frames": is empty`},
		{map[string]any{"corrupt_in": "header"}, `option "corrupt_in": is "header"; want payload or frame`},
		{map[string]any{"delay": "-1s"}, `option "delay": must not be negative, got -1s`},
		{map[string]any{"reset_after": -1}, `option "reset_after": counts frames and must not be negative`},
		{map[string]any{"transport": map[string]any{"name": ""}}, `option "transport.name": must name the transport to wrap`},
		{map[string]any{"transport": map[string]any{"name": "tcp-lv", "options": map[string]any{"max_frame_size": "huge"}}},
			`transport "faulty": option "transport": transport "tcp-lv": option "max_frame_size": `},
		{map[string]any{"transport": map[string]any{"name": "udp"}}, `option "transport": transport "udp": no transport of that name is registered (known: `},
	} {
		_, err := faulty.Factory.Build(c.options, "svc.yaml")
		if err == nil {
			t.Errorf("%v: built; want an error", c.options)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "kernrpc: svc.yaml: ") || !strings.Contains(msg, c.want) || strings.Count(msg, `"faulty"`) != 1 {
			t.Errorf("%v:\n got %s\nwant it to contain %s, naming faulty once", c.options, msg, c.want)
		}
	}
}

func TestLendsMemoryIsTheWrappedTransports(t *testing.T) {
	tr := build(t, nil)
	caps, ok := tr.(kernel.TransportCapabilities)
	if !ok || !caps.LendsMemory() {
		t.Error("faulty over tcp-lv does not report that it lends memory, as tcp-lv does")
	}
}

// Over tcp-lv a wrapped connection offers what tcp-lv's do.
func TestWrappedConnOffersTheWrappedConnsInterfaces(t *testing.T) {
	d, a := pair(t, build(t, map[string]any{"reset_after": 1000}))
	for _, c := range []kernel.Conn{d, a} {
		if _, ok := c.(kernel.BufferedReader); !ok {
			t.Errorf("%T is no BufferedReader", c)
		}
		if _, ok := c.(kernel.FrameQueuer); !ok {
			t.Errorf("%T is no FrameQueuer", c)
		}
		if _, ok := c.(kernel.HalfCloser); !ok {
			t.Errorf("%T is no HalfCloser", c)
		}
	}
}
