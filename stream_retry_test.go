package kernrpc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

func init() {
	kernel.RegisterTransport(kernel.NewFactory(lostOpenName, "test: tcp-lv whose first connection dies while writing a stream's opening request, its reader noticing first",
		func() *lostOpenOptions { return &lostOpenOptions{} },
		func(o *lostOpenOptions) (kernel.Transport, error) {
			inner, err := kernel.NewTransport("tcp-lv", nil, "test")
			if err != nil {
				return nil, err
			}
			return &lostOpen{Transport: inner, mode: o.Mode}, nil
		}))
}

const lostOpenName = "test-lost-open"

// lostOpenOptions say when the first connection dies: before the request
// goes out ("", and the write fails once the reader has failed the
// connection's streams), once it went out ("sent", and the write
// succeeds), or before the request goes out with the write failing first
// ("raced": the reader fails the connection's streams only once the
// opener has taken the write's failure in), or with the write seeming to
// succeed while the server, closing the connection, says in a GoAway that
// it served no call there ("goaway", as tcp-lv does to a connection silent
// for first_frame_timeout).
type lostOpenOptions struct {
	Mode string `json:"mode"`
}

// lostOpen dials through tcp-lv; its first connection is a lostOpenConn.
type lostOpen struct {
	kernel.Transport
	mode  string
	dials atomic.Int32
}

func (t *lostOpen) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	c, err := t.Transport.Dial(ctx, addr)
	if err != nil || t.dials.Add(1) > 1 {
		return c, err
	}
	return &lostOpenConn{Conn: c, mode: t.mode, readFailed: make(chan struct{}), closeCalled: make(chan struct{}), failSeen: make(chan struct{})}, nil
}

// lostOpenConn closes itself while it writes a stream's opening request,
// and returns from the write only once its reader has seen the close and
// the engine has had time to fail the connection's streams: the stream
// being opened is among them.
type lostOpenConn struct {
	kernel.Conn
	mode       string
	readOnce   sync.Once
	readFailed chan struct{}
	// "raced": the engine's Close, called as the reader fails the
	// connection (its streams in hand), lets the write fail, and lets the
	// engine fail those streams only once the opener asks the connection
	// for its Err after the write (writeFailed does): the opener has then
	// taken the failure in.
	closeOnce   sync.Once
	closeCalled chan struct{}
	wrote       atomic.Bool
	failOnce    sync.Once
	failSeen    chan struct{}
	// "goaway": the reader returns the server's GoAway before the
	// connection's failure (reader only).
	goAwaySaid bool
}

func (c *lostOpenConn) Close() error {
	if c.mode == "raced" {
		c.closeOnce.Do(func() {
			close(c.closeCalled)
			select {
			case <-c.failSeen:
			case <-time.After(5 * time.Second):
			}
		})
	}
	return c.Conn.Close()
}

func (c *lostOpenConn) Err() error {
	if c.wrote.Load() {
		c.failOnce.Do(func() { close(c.failSeen) })
	}
	return c.Conn.Err()
}

func (c *lostOpenConn) ReadFrame(ctx context.Context) (*kernel.Frame, error) {
	f, err := c.Conn.ReadFrame(ctx)
	if err != nil && c.mode == "goaway" && !c.goAwaySaid {
		c.goAwaySaid = true
		return &kernel.Frame{Type: kernel.FrameGoAway, CallID: 0, Message: "first_frame_timeout"}, nil
	}
	if err != nil && ctx.Err() == nil {
		c.readOnce.Do(func() { close(c.readFailed) })
	}
	return f, err
}

func (c *lostOpenConn) WriteFrame(f *kernel.Frame) error {
	if f.Type != kernel.FrameRequest || f.Flags&kernel.FlagStream == 0 {
		return c.Conn.WriteFrame(f)
	}
	var err error
	switch c.mode {
	case "":
		if len(f.Payload) > 0 {
			c.Conn.Recycle(f.Payload)
		}
		err = fmt.Errorf("test: the connection was lost before the request went out: %w", kernel.ErrPeerGone)
	case "sent":
		err = c.Conn.WriteFrame(f)
	case "goaway":
		c.Conn.Recycle(f.Payload) // the server will say it never read it
	case "raced":
		c.Conn.Recycle(f.Payload)
		c.Conn.Close()
		<-c.closeCalled
		c.wrote.Store(true)
		return &kernel.Status{Code: kernel.Unavailable, Message: "test: the connection was lost before the request went out"}
	}
	c.Conn.Close()
	<-c.readFailed
	time.Sleep(50 * time.Millisecond)
	return err
}

// A stream whose opening request its connection failed to send (the
// connection reset instead) is opened again on a new connection, and
// works: the attempt that failed leaves nothing of its end behind.
func TestStreamOpenRetriedWhenItsRequestCouldNotBeSent(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, streamHandlers)
	ccfg := *cfg
	// Each connection sends its first request and resets at its second.
	ccfg.Transport = kernrpc.PluginConfig{Name: "faulty", Options: map[string]any{
		"transport": map[string]any{"name": cfg.Transport.Name, "options": cfg.Transport.Options},
		"side":      "dial", "frames": []any{"request"}, "reset_after": 1,
	}}
	cli := newClient(t, &ccfg)
	recvAll(t, cli, 2) // the first connection's one request
	expectOpenedAgain(t, cli, "its first connection reset while sending the request")
}

// A stream whose opening request was never sent is opened again on a new
// connection even when the first connection's reader noticed the loss
// first and failed the connection's streams, this one among them: that
// attempt's end must not reach the stream opened again.
func TestStreamOpenRetriedAfterItsConnectionFailedItFirst(t *testing.T) {
	expectOpenedAgain(t, lostOpenClient(t, ""), "its first connection lost before the request went out")
}

// The same when the write's failure reaches the opener first, and the
// reader's failure of the connection's streams reaches this one only
// after: that old end must not reach the stream opened again either. It
// once did, ending it with the first connection's loss (seen beside a
// fuzzing run, as a data race on the stream's instance).
func TestStreamOpenRetriedWhenItsWriteFailedBeforeItsConnectionFailedIt(t *testing.T) {
	expectOpenedAgain(t, lostOpenClient(t, "raced"), "its write failed first, and its connection's failure came after")
}

// A stream whose opening request went out on a connection the server then
// closed, saying in its GoAway that it served no call there, is opened
// again: the server never opened it.
func TestStreamOpenRetriedWhenTheServersGoAwaySaysItWasNotServed(t *testing.T) {
	expectOpenedAgain(t, lostOpenClient(t, "goaway"), "its request went out and the server's GoAway said it served none")
}

// lostOpenClient starts a server with the stream handlers and returns a
// client of it over a lostOpen transport in mode (lostOpenOptions).
func lostOpenClient(t *testing.T, mode string) *kernrpc.Client {
	t.Helper()
	cfg := testConfig(t)
	startServer(t, cfg, streamHandlers)
	ccfg := *cfg
	ccfg.Transport = kernrpc.PluginConfig{Name: lostOpenName, Options: map[string]any{"mode": mode}}
	return newClient(t, &ccfg)
}

// expectOpenedAgain opens a Count.Echo stream, which how says the first
// attempt lost, and expects it opened on a second attempt and working:
// three echoes, then io.EOF after CloseSend.
func expectOpenedAgain(t *testing.T, cli *kernrpc.Client, how string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Echo")
	if err != nil {
		t.Fatalf("open, %s: %v; want it opened on another connection", how, err)
	}
	defer st.Close()
	if a := st.Info().Attempt; a != 2 {
		t.Fatalf("open, %s: opened on attempt %d; want 2, or this test checked nothing", how, a)
	}
	for i := range 3 {
		text := strconv.Itoa(i)
		if err := st.Send(&echopb.Echo{Text: text}); err != nil {
			t.Fatalf("send %d on the stream opened again: %v", i, err)
		}
		if m, err := st.Recv(); err != nil || m.Text != text {
			t.Fatalf("echo %d on the stream opened again: %q, %v; want %q", i, m.GetText(), err, text)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: %v, %v; want io.EOF", m, err)
	}
}

// A stream whose opening request went out before its connection was lost
// is not opened again (the server may have it): the open fails with
// Unavailable, not retryable.
func TestStreamOpenFailsWhenItsConnectionWasLostAfterTheRequest(t *testing.T) {
	_, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), lostOpenClient(t, "sent"), "Count.Echo")
	if kernel.CodeOf(err) != kernel.Unavailable || kernel.IsRetryable(err) {
		t.Fatalf("open, its connection lost after the request went out: %v; want Unavailable, not retryable", err)
	}
}
