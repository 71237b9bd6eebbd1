// Command streaming serves a server-streaming and a bidirectional method
// and calls both, in one process, over the default transport:
//
//	go run ./examples/streaming
//
// Feed.Watch sends a numbered event for each of the client's requested
// count, with the count in its trailer; Chat.Upper answers every line the
// client sends with the line in upper case, while the client is still
// sending. Then the client stops reading Feed.Watch for a moment, and the
// server's Send waits for credit instead of buffering.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

type (
	text       = wrapperspb.StringValue
	feedServer = kernrpc.ServerStreamOf[wrapperspb.Int32Value, text]
	chatServer = kernrpc.ServerStreamOf[text, text]
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./examples/streaming\n\n"+
			"Serves Feed.Watch (server streaming) and Chat.Upper (bidirectional) and calls both.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	slog.SetLogLoggerLevel(slog.LevelWarn)
	if _, err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "streaming:", err)
		os.Exit(1)
	}
}

// outcome is what the run saw, for its test.
type outcome struct {
	events     []string
	trailer    string
	answers    []string
	sentPaused int64 // Feed.Watch messages the server sent while the client read none
	window     int64
}

func serve(ctx context.Context, cfg *kernrpc.Config, sent *atomic.Int64) (*kernrpc.Server, error) {
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		return nil, err
	}
	kernrpc.HandleServerStream(srv, "Feed.Watch", func(ctx context.Context, req *wrapperspb.Int32Value, st feedServer) error {
		for i := range req.Value {
			// Send waits while the client has granted no credit: a client
			// that stops reading stops this loop, not the server's memory.
			if err := st.Send(wrapperspb.String("event " + strconv.Itoa(int(i)) + strings.Repeat(".", 1000))); err != nil {
				return err
			}
			sent.Add(1)
		}
		st.SetTrailer(kernel.Metadata{"events": strconv.Itoa(int(req.Value))})
		return nil
	})
	kernrpc.HandleBidiStream(srv, "Chat.Upper", func(ctx context.Context, st chatServer) error {
		for {
			line, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return nil // the client closed its side: end with OK
			}
			if err != nil {
				return err
			}
			if err := st.Send(wrapperspb.String(strings.ToUpper(line.Value))); err != nil {
				return err
			}
		}
	})
	return srv, srv.Start(ctx)
}

func run(ctx context.Context, w io.Writer) (*outcome, error) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "streaming-example"
	cfg.Streams.Window = 64 << 10 // small, so that the pause below shows
	var sent atomic.Int64
	srv, err := serve(ctx, cfg, &sent)
	if err != nil {
		return nil, err
	}
	defer srv.Shutdown(ctx)
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	o := &outcome{window: int64(cfg.Streams.Window)}
	if err := watch(ctx, cli, w, o); err != nil {
		return nil, fmt.Errorf("Feed.Watch: %w", err)
	}
	if err := chat(ctx, cli, w, o); err != nil {
		return nil, fmt.Errorf("Chat.Upper: %w", err)
	}
	if err := pause(ctx, cli, w, o, &sent); err != nil {
		return nil, fmt.Errorf("Feed.Watch with a pause: %w", err)
	}
	return o, nil
}

// watch reads a short server stream to its end.
func watch(ctx context.Context, cli *kernrpc.Client, w io.Writer, o *outcome) error {
	fmt.Fprintln(w, "Feed.Watch: asking for 5 events (server streaming)")
	st, err := kernrpc.OpenServerStream[wrapperspb.Int32Value, text](ctx, cli, "Feed.Watch", wrapperspb.Int32(5))
	if err != nil {
		return err
	}
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		event := strings.TrimRight(ev.Value, ".")
		o.events = append(o.events, event)
		fmt.Fprintln(w, "  received", event)
	}
	o.trailer = st.Trailer()["events"]
	fmt.Fprintf(w, "  stream ended with OK; trailer events=%s\n", o.trailer)
	return nil
}

// chat sends lines while it reads the answers to earlier ones.
func chat(ctx context.Context, cli *kernrpc.Client, w io.Writer, o *outcome) error {
	fmt.Fprintln(w, "Chat.Upper: sending 4 lines while reading the answers (bidirectional)")
	st, err := kernrpc.OpenStream[text, text](ctx, cli, "Chat.Upper")
	if err != nil {
		return err
	}
	sent := make(chan error, 1)
	go func() {
		for _, line := range []string{"hello", "streams share", "one connection", "bye"} {
			if err := st.Send(wrapperspb.String(line)); err != nil {
				sent <- err
				return
			}
		}
		sent <- st.CloseSend()
	}()
	for {
		answer, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		o.answers = append(o.answers, answer.Value)
		fmt.Fprintln(w, "  answer:", answer.Value)
	}
	return <-sent
}

// pause stops reading a long stream for a moment: the server's Send waits
// for credit, then the stream resumes where it was.
func pause(ctx context.Context, cli *kernrpc.Client, w io.Writer, o *outcome, sent *atomic.Int64) error {
	sent.Store(0)
	st, err := kernrpc.OpenServerStream[wrapperspb.Int32Value, text](ctx, cli, "Feed.Watch", wrapperspb.Int32(1000))
	if err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond) // read nothing
	o.sentPaused = sent.Load()
	fmt.Fprintf(w, "Flow control: the client read nothing for 200ms; the server sent %d events of 1 KiB, then waited (window %d KiB)\n", o.sentPaused, o.window>>10)
	n := 0
	for ; ; n++ {
		if _, err := st.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "  then it read all %d events\n", n)
	if n != 1000 {
		return fmt.Errorf("read %d events, want 1000", n)
	}
	return nil
}
