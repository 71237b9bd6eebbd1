// Package golden_test builds the generator's golden output (gentestv1 and
// commonv1, which TestGolden in cmd/protoc-gen-kernrpc keeps equal to what
// the generator makes of testdata/proto) and runs a real server and client
// over it: every call model of a unary method, and each kind of stream.
package golden_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/cmd/protoc-gen-kernrpc/internal/golden/commonv1"
	"github.com/kernrpc/kernrpc/cmd/protoc-gen-kernrpc/internal/golden/gentestv1"
	"github.com/kernrpc/kernrpc/kernel"
)

// The tests run a server and clients in this process: none of their
// goroutines may outlive the tests. The servers' informational logs would
// only bury a failure's.
func TestMain(m *testing.M) {
	slog.SetLogLoggerLevel(slog.LevelWarn)
	goleak.VerifyTestMain(m)
}

// greeter implements gentestv1.GreeterServer.
type greeter struct{}

func (greeter) Hello(ctx context.Context, req *gentestv1.HelloRequest) (*gentestv1.HelloReply, error) {
	if req.GetName() == "" {
		return nil, kernel.Errorf(kernel.InvalidArgument, "say who you are")
	}
	msg := "hello, " + strings.Join(append(req.GetOptions().GetTitles(), req.GetName()), " ")
	if req.GetOptions().GetShout() {
		msg = strings.ToUpper(msg)
	}
	info := kernrpc.CallInfoFrom(ctx)
	reply := &gentestv1.HelloReply{
		Message: msg,
		At:      timestamppb.New(time.Unix(1700000000, 42)),
		Counts:  map[string]int32{"letters": int32(len(req.GetName()))},
		Extra:   &gentestv1.HelloReply_Note{Note: info.Method + " " + info.Metadata["who-asks"]},
		Maybe:   proto.Int32(0),
	}
	return reply, nil
}

func (g greeter) OldHello(ctx context.Context, req *gentestv1.HelloRequest) (*gentestv1.HelloReply, error) {
	return g.Hello(ctx, req)
}

func (greeter) Ping(ctx context.Context, req *emptypb.Empty) (*emptypb.Empty, error) {
	return req, nil
}

// transfer implements gentestv1.TransferServer.
type transfer struct{}

func (transfer) Watch(ctx context.Context, req *gentestv1.WatchRequest, st kernrpc.ServerStreamOf[gentestv1.WatchRequest, gentestv1.Event]) error {
	if req.GetCount() < 0 {
		return kernel.Errorf(kernel.InvalidArgument, "count %d is negative", req.GetCount())
	}
	for i := range req.GetCount() {
		ev := &gentestv1.Event{Seq: int64(i), Mood: gentestv1.Mood_MOOD_HAPPY, Topic: req.GetTopic(),
			Options: &gentestv1.HelloRequest_Options{Titles: []string{fmt.Sprint("n", i)}}}
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (transfer) Upload(ctx context.Context, st kernrpc.ServerStreamOf[commonv1.Chunk, gentestv1.UploadSummary]) (*gentestv1.UploadSummary, error) {
	sum := new(gentestv1.UploadSummary)
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return sum, nil
		}
		if err != nil {
			return nil, err
		}
		if c.GetSentAt() == nil {
			return nil, kernel.Errorf(kernel.InvalidArgument, "chunk %d has no sent_at", sum.Chunks)
		}
		sum.Chunks++
		sum.Bytes += int64(len(c.GetData()))
		sum.Labels = append(sum.Labels, c.GetLabels()...)
	}
}

func (transfer) Chat(ctx context.Context, st kernrpc.ServerStreamOf[gentestv1.ChatMessage, gentestv1.ChatMessage]) error {
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(&gentestv1.ChatMessage{Text: "re: " + m.GetText(), Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

// admin implements gentestv1.AdminServiceServer, whose .proto names are
// snake case.
type admin struct{}

func (admin) ResetAll(ctx context.Context, req *gentestv1.ResetRequest) (*gentestv1.ResetReply, error) {
	if kernrpc.CallInfoFrom(ctx).Method != "kernrpc.gentest.v1.admin_service.reset_all" {
		return nil, kernel.Errorf(kernel.Internal, "called as %q", kernrpc.CallInfoFrom(ctx).Method)
	}
	return &gentestv1.ResetReply{Forgotten: 3}, nil
}

func (admin) TailEvents(ctx context.Context, req *gentestv1.WatchRequest, st kernrpc.ServerStreamOf[gentestv1.WatchRequest, gentestv1.Event]) error {
	return st.Send(&gentestv1.Event{Topic: req.GetTopic()})
}

// serve starts a server with every generated service and returns a client
// of it, both stopped when the test ends.
func serve(t *testing.T) *kernrpc.Client {
	t.Helper()
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "gentest"
	cfg.Registry.Options = map[string]any{"namespace": "golden-" + t.Name()}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gentestv1.RegisterGreeterServer(srv, greeter{})
	gentestv1.RegisterTransferServer(srv, transfer{})
	gentestv1.RegisterAdminServiceServer(srv, admin{})
	gentestv1.RegisterIdleServer(srv, struct{}{}) // no methods to implement
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	cli, err := kernrpc.NewClient(cfg, "gentest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUnaryInEveryCallModel(t *testing.T) {
	cli := serve(t)
	ctx := testContext(t)
	g := gentestv1.NewGreeterClient(cli)
	req := &gentestv1.HelloRequest{Name: "ada", Options: &gentestv1.HelloRequest_Options{Shout: true, Titles: []string{"dr"}}}
	want := &gentestv1.HelloReply{
		Message: "HELLO, DR ADA",
		At:      timestamppb.New(time.Unix(1700000000, 42)),
		Counts:  map[string]int32{"letters": 3},
		Extra:   &gentestv1.HelloReply_Note{Note: gentestv1.Greeter_Hello_FullMethodName + " tester"},
		Maybe:   proto.Int32(0),
	}
	md := kernrpc.CallMetadata(kernel.Metadata{"who-asks": "tester"})

	got, err := g.Hello(ctx, req, md)
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("Hello = %v, want %v", got, want)
	}

	call := <-g.HelloAsync(ctx, req, nil, md).Done
	if call.Err != nil {
		t.Fatalf("HelloAsync: %v", call.Err)
	}
	if r, ok := call.Response.(*gentestv1.HelloReply); !ok || !proto.Equal(r, want) {
		t.Errorf("HelloAsync's Response = %v, want %v", call.Response, want)
	}
	if call.Method != gentestv1.Greeter_Hello_FullMethodName {
		t.Errorf("HelloAsync's Method = %q, want %q", call.Method, gentestv1.Greeter_Hello_FullMethodName)
	}

	type result struct {
		r   *gentestv1.HelloReply
		err error
	}
	done := make(chan result, 1)
	g.HelloFunc(ctx, req, func(r *gentestv1.HelloReply, err error) { done <- result{r, err} }, md)
	if res := <-done; res.err != nil || !proto.Equal(res.r, want) {
		t.Errorf("HelloFunc gave %v, %v; want %v", res.r, res.err, want)
	}

	// A deprecated method still works; a well-known type as request and
	// response.
	//lint:ignore SA1019 a deprecated method is what is tested
	if _, err := g.OldHello(ctx, req); err != nil {
		t.Errorf("OldHello: %v", err)
	}
	if _, err := g.Ping(ctx, &emptypb.Empty{}); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// A status from the handler reaches the caller in every call model, with
// a nil response.
func TestUnaryStatusInEveryCallModel(t *testing.T) {
	cli := serve(t)
	ctx := testContext(t)
	g := gentestv1.NewGreeterClient(cli)
	bad := &gentestv1.HelloRequest{}

	r, err := g.Hello(ctx, bad)
	if kernel.CodeOf(err) != kernel.InvalidArgument || r != nil {
		t.Errorf("Hello(no name) = %v, %v; want nil, InvalidArgument", r, err)
	}
	if call := <-g.HelloAsync(ctx, bad, make(chan *kernrpc.Call, 1)).Done; kernel.CodeOf(call.Err) != kernel.InvalidArgument {
		t.Errorf("HelloAsync(no name): %v, want InvalidArgument", call.Err)
	}
	done := make(chan error, 1)
	g.HelloFunc(ctx, bad, func(r *gentestv1.HelloReply, err error) {
		if r != nil {
			err = fmt.Errorf("a response %v beside the error %w", r, err)
		}
		done <- err
	})
	if err := <-done; kernel.CodeOf(err) != kernel.InvalidArgument {
		t.Errorf("HelloFunc(no name): %v, want InvalidArgument", err)
	}

	// A call option reaches the call: a timeout already over.
	if _, err := g.Hello(ctx, &gentestv1.HelloRequest{Name: "x"}, kernrpc.CallTimeout(time.Nanosecond)); kernel.CodeOf(err) != kernel.DeadlineExceeded {
		t.Errorf("Hello with CallTimeout(1ns): %v, want DeadlineExceeded", err)
	}
}

func TestServerStream(t *testing.T) {
	cli := serve(t)
	ctx := testContext(t)
	tr := gentestv1.NewTransferClient(cli)
	st, err := tr.Watch(ctx, &gentestv1.WatchRequest{Topic: "news", Count: 3})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for i := range 3 {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if ev.GetSeq() != int64(i) || ev.GetTopic() != "news" || ev.GetMood() != gentestv1.Mood_MOOD_HAPPY || ev.GetOptions().GetTitles()[0] != fmt.Sprint("n", i) {
			t.Errorf("event %d = %v", i, ev)
		}
	}
	if ev, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after 3 events: %v, %v; want io.EOF", ev, err)
	}

	st, err = tr.Watch(ctx, &gentestv1.WatchRequest{Count: -1})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if _, err := st.Recv(); kernel.CodeOf(err) != kernel.InvalidArgument {
		t.Errorf("Watch(count -1): Recv gave %v, want InvalidArgument", err)
	}

	// The snake-case service's stream, by its .proto name.
	tail, err := gentestv1.NewAdminServiceClient(cli).TailEvents(ctx, &gentestv1.WatchRequest{Topic: "t"})
	if err != nil {
		t.Fatalf("TailEvents: %v", err)
	}
	if ev, err := tail.Recv(); err != nil || ev.GetTopic() != "t" {
		t.Errorf("TailEvents: %v, %v", ev, err)
	}
	if _, err := tail.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("TailEvents after its event: %v, want io.EOF", err)
	}
}

func TestClientStream(t *testing.T) {
	cli := serve(t)
	ctx := testContext(t)
	tr := gentestv1.NewTransferClient(cli)
	st, err := tr.Upload(ctx)
	if err != nil {
		t.Fatalf("Upload: %v", err)
	}
	for i, size := range []int{10, 0, 4096} {
		c := &commonv1.Chunk{Data: make([]byte, size), SentAt: timestamppb.Now(), Labels: []string{fmt.Sprint("c", i)}}
		if err := st.Send(c); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
	}
	sum, err := st.CloseAndRecv()
	if err != nil {
		t.Fatalf("CloseAndRecv: %v", err)
	}
	want := &gentestv1.UploadSummary{Chunks: 3, Bytes: 4106, Labels: []string{"c0", "c1", "c2"}}
	if !proto.Equal(sum, want) {
		t.Errorf("summary %v, want %v", sum, want)
	}

	st, err = tr.Upload(ctx)
	if err != nil {
		t.Fatalf("Upload: %v", err)
	}
	if err := st.Send(&commonv1.Chunk{}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("Send: %v", err)
	}
	if _, err := st.CloseAndRecv(); kernel.CodeOf(err) != kernel.InvalidArgument {
		t.Errorf("a chunk without sent_at: CloseAndRecv gave %v, want InvalidArgument", err)
	}
}

func TestBidiStream(t *testing.T) {
	cli := serve(t)
	ctx := testContext(t)
	st, err := gentestv1.NewTransferClient(cli).Chat(ctx)
	if err != nil {
		t.Fatalf("Chat: %v", err)
	}
	for i := range 3 {
		text := fmt.Sprint("line ", i)
		if err := st.Send(&gentestv1.ChatMessage{Text: text, Payload: []byte{byte(i)}}); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if m.GetText() != "re: "+text || len(m.GetPayload()) != 1 || m.GetPayload()[0] != byte(i) {
			t.Errorf("answer %d = %v", i, m)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatalf("CloseSend: %v", err)
	}
	if m, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after CloseSend: %v, %v; want io.EOF", m, err)
	}
}

// Clients of several services share one kernrpc.Client, concurrently.
func TestTypedClientsShareAClient(t *testing.T) {
	cli := serve(t)
	ctx := testContext(t)
	g, a := gentestv1.NewGreeterClient(cli), gentestv1.NewAdminServiceClient(cli)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 10 {
		wg.Go(func() {
			if r, err := g.Hello(ctx, &gentestv1.HelloRequest{Name: fmt.Sprint("n", i)}); err != nil || r.GetMessage() != fmt.Sprint("hello, n", i) {
				errs <- fmt.Errorf("Hello %d: %v, %v", i, r, err)
			}
		})
		wg.Go(func() {
			if r, err := a.ResetAll(ctx, &gentestv1.ResetRequest{DryRun: true}); err != nil || r.GetForgotten() != 3 {
				errs <- fmt.Errorf("ResetAll %d: %v, %v", i, r, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A method registered twice panics, as kernrpc.Handle does.
func TestRegisterTwicePanics(t *testing.T) {
	srv, err := kernrpc.NewServer(kernrpc.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	gentestv1.RegisterGreeterServer(srv, greeter{})
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), gentestv1.Greeter_Hello_FullMethodName) {
			t.Errorf("registering Greeter twice: recovered %v, want a panic naming %s", r, gentestv1.Greeter_Hello_FullMethodName)
		}
	}()
	gentestv1.RegisterGreeterServer(srv, greeter{})
}
