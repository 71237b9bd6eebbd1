package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

var (
	transports = []string{"tcp-lv", "shm-ring", faultyTCP}
	codecs     = []string{"protobuf", "json", "msgpack", "flatbuffers"}
)

const (
	method     = "Echo.Echo"
	maxPayload = 256 << 10
	namespace  = "kernrpc-soak"
)

// counts are the calls and streams made so far, by outcome, the streams
// among them, and the clients opened. faulted counts those that faultyTCP's
// faults ended.
type counts struct {
	ok, expected, faulted, failed, wrong, streams, opened atomic.Int64
}

// traffic is the servers, the clients and the callers between them.
type traffic struct {
	servers []*kernrpc.Server
	slots   []*slot // one client per transport and codec, replaced while calls run
	counts  counts
	// quiet: callers hold it shared around each call; a sample takes it
	// exclusively, so that figures are read with no call in flight.
	quiet  sync.RWMutex
	source []byte // payloads are slices of it, read-only
	seed   uint64
	log    *slog.Logger
}

// slot holds the current client of one transport and codec; calls hold a
// reference so that the churner closes a client only once its calls end.
type slot struct {
	transport, codec string
	mu               sync.Mutex
	cur              *client
}

type client struct {
	cli   *kernrpc.Client
	calls sync.WaitGroup
}

func serviceOf(transport string) string { return "soak-" + transport }

func config(transport, codec string, seed uint64) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = serviceOf(transport)
	cfg.Address = "127.0.0.1:0" // shm-ring: a fresh abstract socket name
	cfg.Transport = transportConfig(transport, seed)
	cfg.Codec = kernrpc.PluginConfig{Name: codec}
	cfg.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{"namespace": namespace}}
	cfg.Client.Timeout = kernel.Duration(10 * time.Second)
	if transport == faultyTCP {
		cfg.Client.Timeout = kernel.Duration(faultyCallTimeout)
	}
	return cfg
}

func startTraffic(ctx context.Context, log *slog.Logger, seed uint64) (*traffic, error) {
	t := &traffic{log: log, source: make([]byte, 2*maxPayload), seed: seed}
	fill(t.source, rand.New(rand.NewPCG(seed, 0)))
	for _, tr := range transports {
		srv, err := kernrpc.NewServer(config(tr, "protobuf", seed))
		if err != nil {
			t.stop()
			return nil, fmt.Errorf("server over %s: %w", tr, err)
		}
		kernrpc.Handle(srv, method, echo)
		handleStreams(srv)
		if err := srv.Start(ctx); err != nil {
			t.stop()
			return nil, fmt.Errorf("start server over %s: %w", tr, err)
		}
		t.servers = append(t.servers, srv)
	}
	for _, tr := range transports {
		for _, c := range codecs {
			s := &slot{transport: tr, codec: c}
			if err := t.renew(s); err != nil {
				t.stop()
				return nil, err
			}
			t.slots = append(t.slots, s)
		}
	}
	return t, nil
}

// fill makes payloads random, so that a codec or transport mixing up two
// calls' bytes is caught.
func fill(b []byte, rng *rand.Rand) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// echo answers with the request after the delay its text asks for, unless
// the call ends first: that is how callers make calls outlive deadlines.
func echo(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
	_, d, _ := strings.Cut(req.Text, " delay=")
	if us, _ := strconv.Atoi(d); us > 0 {
		tm := time.NewTimer(time.Duration(us) * time.Microsecond)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			return nil, kernel.Errorf(kernel.CodeOf(ctx.Err()), "echo: %v", ctx.Err())
		}
	}
	return req, nil
}

// renew replaces s's client with a new one and closes the old one once
// the calls it carries have returned.
func (t *traffic) renew(s *slot) error {
	cli, err := kernrpc.NewClient(config(s.transport, s.codec, t.seed), serviceOf(s.transport))
	if err != nil {
		return fmt.Errorf("client over %s in %s: %w", s.transport, s.codec, err)
	}
	t.counts.opened.Add(1)
	s.mu.Lock()
	old := s.cur
	s.cur = &client{cli: cli}
	s.mu.Unlock()
	if old != nil {
		old.calls.Wait()
		if err := old.cli.Close(); err != nil {
			return fmt.Errorf("close client over %s in %s: %w", s.transport, s.codec, err)
		}
	}
	return nil
}

func (s *slot) acquire() *client {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.calls.Add(1)
	return s.cur
}

// churn replaces a random client every period until ctx ends, so that
// connections keep opening and closing.
func (t *traffic) churn(ctx context.Context, period time.Duration, rng *rand.Rand) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.quiet.RLock()
		err := t.renew(t.slots[rng.IntN(len(t.slots))])
		t.quiet.RUnlock()
		if err != nil {
			t.log.Error("soak: churn", "err", err)
			t.counts.failed.Add(1)
		}
	}
}

// callLoop makes calls until ctx ends.
func (t *traffic) callLoop(ctx context.Context, id int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	for n := 0; ctx.Err() == nil; n++ {
		t.quiet.RLock()
		s := t.slots[rng.IntN(len(t.slots))]
		c := s.acquire()
		if name := fmt.Sprintf("%d/%d", id, n); rng.IntN(5) == 0 {
			t.oneStream(c.cli, s, rng, name)
		} else {
			t.oneCall(c.cli, s, rng, name)
		}
		c.calls.Done()
		t.quiet.RUnlock()
	}
}

// payloadSize is mostly small, sometimes up to 256 KiB.
func payloadSize(rng *rand.Rand) int {
	switch rng.IntN(10) {
	case 0, 1, 2:
		return 0
	case 3, 4, 5:
		return rng.IntN(64)
	case 6, 7:
		return rng.IntN(4 << 10)
	case 8:
		return rng.IntN(64 << 10)
	}
	return rng.IntN(maxPayload + 1)
}

// payload is a random slice of the source, of payloadSize.
func (t *traffic) payload(rng *rand.Rand) []byte {
	size := payloadSize(rng)
	off := rng.IntN(len(t.source) - size + 1)
	return t.source[off : off+size]
}

// oneCall makes one call of a random kind: plain, asynchronous, with a
// deadline the server may outlast, or cancelled while it runs.
func (t *traffic) oneCall(cli *kernrpc.Client, s *slot, rng *rand.Rand, name string) {
	req := &echopb.Echo{Text: name, Payload: t.payload(rng)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kind := rng.IntN(10)
	var stopCancel func() bool
	switch kind {
	case 6, 7: // a deadline of 1-20 ms, a server delay of 0-30 ms
		ctx, cancel = context.WithTimeout(ctx, time.Duration(1+rng.IntN(20))*time.Millisecond)
		defer cancel()
		req.Text += " delay=" + strconv.Itoa(rng.IntN(30_000))
	case 8: // cancelled after 0-10 ms, a server delay of 0-20 ms
		stopCancel = time.AfterFunc(time.Duration(rng.IntN(10_000))*time.Microsecond, cancel).Stop
		req.Text += " delay=" + strconv.Itoa(rng.IntN(20_000))
	}
	var resp echopb.Echo
	var err error
	if kind == 9 {
		call := <-cli.Go(ctx, method, req, &resp, nil).Done
		err = call.Err
	} else {
		err = cli.Call(ctx, method, req, &resp)
	}
	if stopCancel != nil {
		stopCancel()
	}
	if err == nil {
		err = sameMessage(0, &resp, req)
	}
	t.record(s, name, err, kind >= 6 && kind <= 8)
}

// record counts a call's or a stream's outcome; mayFail says that it was
// given a deadline or cancelled on purpose.
func (t *traffic) record(s *slot, name string, err error, mayFail bool) {
	code := kernel.CodeOf(err)
	switch {
	case err == nil:
		t.counts.ok.Add(1)
	case errors.Is(err, errWrong):
		t.counts.wrong.Add(1)
		t.log.Error("soak: wrong answer", "transport", s.transport, "codec", s.codec, "call", name, "err", err)
	case mayFail && (code == kernel.DeadlineExceeded || code == kernel.Canceled || errors.Is(err, context.Canceled)):
		t.counts.expected.Add(1)
	case s.transport == faultyTCP && faultEnded(err):
		t.counts.faulted.Add(1)
	default:
		if t.counts.failed.Add(1) <= 20 { // the first ones say what broke; the count says how often
			t.log.Error("soak: failed", "transport", s.transport, "codec", s.codec, "call", name, "err", err)
		}
	}
}

// stop closes every client, then shuts every server down.
func (t *traffic) stop() error {
	var errs []error
	for _, s := range t.slots {
		if s.cur != nil {
			s.cur.calls.Wait()
			errs = append(errs, s.cur.cli.Close())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, srv := range t.servers {
		errs = append(errs, srv.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
