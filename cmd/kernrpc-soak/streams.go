package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/echostream"
	"github.com/kernrpc/kernrpc/kernel"
)

const (
	chatMethod   = "Echo.Chat"   // bidirectional: every message echoed back
	repeatMethod = "Echo.Repeat" // server-streaming: the request's payload sent back n times
	maxMessages  = 16            // a stream's messages, at most
)

// handleStreams registers the soak's stream methods on srv.
func handleStreams(srv *kernrpc.Server) {
	kernrpc.HandleBidiStream(srv, chatMethod, echostream.Serve[echopb.Echo])
	kernrpc.HandleServerStream(srv, repeatMethod, serveRepeat)
}

// serveRepeat sends the request's payload back as many times as its text's
// " n=" asks, each message's text its index.
func serveRepeat(_ context.Context, req *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
	_, count, _ := strings.Cut(req.Text, " n=")
	n, err := strconv.Atoi(count)
	if err != nil || n < 0 || n > maxMessages {
		return kernel.Errorf(kernel.InvalidArgument, "repeat: %q asks for no count from 0 to %d", req.Text, maxMessages)
	}
	for i := range n {
		if err := st.Send(&echopb.Echo{Text: strconv.Itoa(i), Payload: req.Payload}); err != nil {
			return err
		}
	}
	return nil
}

// errWrong marks a stream that delivered a message other than the one due.
var errWrong = errors.New("wrong message")

// oneStream runs a stream of a random kind: a chat of 1-16 messages, each
// read back before the next is sent, or 1-16 repeats of one payload read
// at the end. One in four is given up part way, half of those by closing
// the stream and half by cancelling its context, as a caller that lost
// interest does.
func (t *traffic) oneStream(cli *kernrpc.Client, s *slot, rng *rand.Rand, name string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if s.transport == faultyTCP {
		ctx, cancel = context.WithTimeout(ctx, faultyStreamTimeout)
		defer cancel()
	}
	n := 1 + rng.IntN(maxMessages)
	quit := streamQuit{at: -1}
	if rng.IntN(4) == 0 {
		quit = streamQuit{at: rng.IntN(n), cancel: rng.IntN(2) == 0}
	}
	var err error
	if rng.IntN(2) == 0 {
		err = t.chat(ctx, cancel, cli, rng, name, n, quit)
	} else {
		err = t.repeat(ctx, cancel, cli, rng, name, n, quit)
	}
	t.counts.streams.Add(1)
	t.record(s, name, err, quit.at >= 0)
}

// streamQuit says where a caller gives its stream up: before message at
// (none if at is negative), by cancelling its context or closing it.
type streamQuit struct {
	at     int
	cancel bool
}

// now gives the stream up if message i is where, and reports whether it
// did.
func (q streamQuit) now(i int, cancel context.CancelFunc, st *kernrpc.ClientStream) bool {
	if i != q.at {
		return false
	}
	if q.cancel {
		cancel()
		return false // the stream's next step reports the cancellation
	}
	st.Close()
	return true
}

func (t *traffic) chat(ctx context.Context, cancel context.CancelFunc, cli *kernrpc.Client, rng *rand.Rand, name string, n int, quit streamQuit) error {
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, chatMethod)
	if err != nil {
		return err
	}
	defer st.Close()
	for i := range n {
		if quit.now(i, cancel, st.ClientStream) {
			return context.Canceled
		}
		want := &echopb.Echo{Text: name + "/" + strconv.Itoa(i), Payload: t.payload(rng)}
		if err := st.Send(want); err != nil {
			return err
		}
		got, err := st.Recv()
		if err != nil {
			return err
		}
		if err := sameMessage(i, got, want); err != nil {
			return err
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return expectEnd(st)
}

func (t *traffic) repeat(ctx context.Context, cancel context.CancelFunc, cli *kernrpc.Client, rng *rand.Rand, name string, n int, quit streamQuit) error {
	req := &echopb.Echo{Text: name + " n=" + strconv.Itoa(n), Payload: t.payload(rng)}
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, repeatMethod, req)
	if err != nil {
		return err
	}
	defer st.Close()
	for i := range n {
		if quit.now(i, cancel, st.ClientStream) {
			return context.Canceled
		}
		got, err := st.Recv()
		if err != nil {
			return err
		}
		if err := sameMessage(i, got, &echopb.Echo{Text: strconv.Itoa(i), Payload: req.Payload}); err != nil {
			return err
		}
	}
	return expectEnd(st)
}

// expectEnd reads the end of a stream whose messages were all read.
func expectEnd(st kernrpc.ClientStreamOf[echopb.Echo, echopb.Echo]) error {
	m, err := st.Recv()
	switch {
	case err == nil:
		return fmt.Errorf("%w: %q after the last message", errWrong, m.Text)
	case errors.Is(err, io.EOF):
		return nil
	}
	return err
}

func sameMessage(i int, got, want *echopb.Echo) error {
	if got.Text != want.Text || !bytes.Equal(got.Payload, want.Payload) {
		return fmt.Errorf("%w: message %d is %q with %d bytes, want %q with %d", errWrong, i, got.Text, len(got.Payload), want.Text, len(want.Payload))
	}
	return nil
}
