package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// The three ways a run calls the servers (-mode). Every selected system
// runs in every selected mode, in the same rounds as its peers.
//
//   - long: the callers of a round share one client, made before the
//     round (the matrix of -payloads × -callers).
//   - short: every call has a client of its own: make it, call once,
//     close it, as a program that connects per request does
//     (-short-callers concurrent callers, 16 B).
//   - many: -clients client processes (this binary, re-executed), each
//     with one client shared by -client-callers callers, against the one
//     server process (16 B); see many.go.
//   - stream: server streaming, -streams concurrent streams sharing one
//     client, messages of each of -stream-sizes; see stream.go.
const (
	modeLong   = "long"
	modeShort  = "short"
	modeMany   = "many"
	modeStream = "stream"
)

// modeOrder is the order modes run in and appear in the report.
var modeOrder = []string{modeLong, modeShort, modeMany, modeStream}

// modePayload is the payload of the short and many modes: small, so that
// what they measure is connection setup and the server's per-call cost.
const modePayload = 16

var modeTitles = map[string]string{
	modeLong:   "Long connections: the callers share one client",
	modeShort:  "Short connections: a client of its own per call (connect, call, close)",
	modeMany:   "Many clients: client processes against one server",
	modeStream: "Server streaming: messages as fast as flow control allows",
}

// parseModes reads -mode: a comma-separated list of modes, or all.
func parseModes(s string) ([]string, error) {
	names := splitList(s)
	for _, n := range names {
		if n != "all" && !slices.Contains(modeOrder, n) {
			return nil, fmt.Errorf("unknown mode %q; known: %s, or all", n, strings.Join(modeOrder, ", "))
		}
	}
	if slices.Contains(names, "all") {
		return modeOrder, nil
	}
	var out []string
	for _, m := range modeOrder {
		if slices.Contains(names, m) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no mode given; give one or more of %s, or all", strings.Join(modeOrder, ", "))
	}
	return out, nil
}

// cells lists the run's cells, mode by mode.
func (o *options) cells() []cell {
	var cs []cell
	for _, m := range o.modes {
		switch m {
		case modeLong:
			for _, p := range o.payloads {
				for _, c := range o.callers {
					cs = append(cs, cell{mode: m, payload: p, callers: c})
				}
			}
		case modeShort:
			for _, c := range o.shortCallers {
				cs = append(cs, cell{mode: m, payload: modePayload, callers: c})
			}
		case modeMany:
			for _, p := range o.manyPayloads {
				for _, n := range o.clients {
					cs = append(cs, cell{mode: m, payload: p, callers: o.clientCallers, clients: n})
				}
			}
		case modeStream:
			for _, p := range o.streamSizes {
				for _, n := range o.streams {
					cs = append(cs, cell{mode: m, payload: p, callers: n})
				}
			}
		}
	}
	return cs
}

// String names a cell in progress lines and errors.
func (c cell) String() string {
	switch c.mode {
	case modeShort:
		return fmt.Sprintf("short, %s, callers %d", sizeName(c.payload), c.callers)
	case modeMany:
		return fmt.Sprintf("many, %s, %d clients × %d callers", sizeName(c.payload), c.clients, c.callers)
	case modeStream:
		return fmt.Sprintf("stream, %s messages, %s", sizeName(c.payload), streamsName(c.callers))
	}
	return fmt.Sprintf("%s, callers %d", sizeName(c.payload), c.callers)
}

// callersName is a cell's row label in the tables.
func (c cell) callersName() string {
	if c.mode == modeMany {
		return fmt.Sprintf("%d × %d", c.clients, c.callers)
	}
	return fmt.Sprint(c.callers)
}

// shortCaller is one caller of the short mode: every call makes a client of
// sys, calls once on it and closes it, so that connecting, the first call's
// setup and tearing down are all inside the call's time and allocations.
func shortCaller(sys *system, addr string, payload []byte) callFunc {
	return func(ctx context.Context) (int, error) {
		cli, err := sys.dial(ctx, addr)
		if err != nil {
			return 0, err
		}
		n, err := cli.newCaller(payload)(ctx)
		if cerr := cli.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close: %w", cerr)
		}
		return n, err
	}
}
