package etcd_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

// fakeEtcd answers a registry's Range with no keys and serves its
// watches one at a time: each watch's creation is sent on created, then
// the watch sends every event given on events, and ends with an error
// that the etcd client does not retry itself when end is signalled. A
// watch's created response holds the revision of the last event sent, as
// etcd's holds its current revision.
type fakeEtcd struct {
	pb.UnimplementedKVServer
	pb.UnimplementedWatchServer
	created chan time.Time
	events  chan *mvccpb.Event
	end     chan struct{}
	rev     atomic.Int64
}

func (f *fakeEtcd) Range(context.Context, *pb.RangeRequest) (*pb.RangeResponse, error) {
	return &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 1}}, nil
}

func (f *fakeEtcd) Watch(stream pb.Watch_WatchServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&pb.WatchResponse{Header: &pb.ResponseHeader{Revision: max(1, f.rev.Load())}, Created: true}); err != nil {
		return err
	}
	f.created <- time.Now()
	for {
		select {
		case ev := <-f.events:
			f.rev.Store(ev.Kv.ModRevision)
			if err := stream.Send(&pb.WatchResponse{Header: &pb.ResponseHeader{Revision: ev.Kv.ModRevision}, Events: []*mvccpb.Event{ev}}); err != nil {
				return err
			}
		case <-f.end:
			return status.Error(codes.FailedPrecondition, "fake: watch ended")
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// A watch that worked (it carried changes) and then ended is resumed
// after the first, short pause however many watches ended before it: the
// pause grows only while watches fail in a row, so a registry that lived
// through a few disconnects does not lag a second behind every later one.
func TestWatchResumeBackoffStartsOverAfterAWatchThatWorked(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeEtcd{created: make(chan time.Time, 1), events: make(chan *mvccpb.Event), end: make(chan struct{})}
	srv := grpc.NewServer()
	pb.RegisterKVServer(srv, f)
	pb.RegisterWatchServer(srv, f)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	opts := *etcd.DefaultOptions()
	opts.Endpoints, opts.Prefix = []string{l.Addr().String()}, "/p/"
	r, err := etcd.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ch, err := r.Watch(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	<-ch // the first set, empty

	var ended time.Time
	for i := range 7 {
		created := <-f.created
		if i > 0 {
			// The first pause is 100ms; a second is what the pause
			// grows to. The margin is for a loaded machine.
			if gap := created.Sub(ended); gap > 600*time.Millisecond {
				t.Errorf("watch %d resumed %s after the one before, which carried a change, ended; want the first pause, 100ms", i, gap.Round(time.Millisecond))
			}
		}
		id := fmt.Sprint(i)
		f.events <- &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{
			Key: []byte("/p/svc/" + id), Value: []byte(`{"address":"127.0.0.1:1"}`), ModRevision: int64(2 + i)}}
		if set := <-ch; len(set) != i+1 {
			t.Fatalf("watch %d: a set of %d instances; want %d", i, len(set), i+1)
		}
		ended = time.Now()
		f.end <- struct{}{}
	}
	if s := r.Stats(); s.WatchResumes < 6 {
		t.Errorf("stats %+v; want 6 resumes", s)
	}
}
