package accesslog

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/kernel"
)

// lines is a slog destination whose JSON lines a test takes, decoded.
type lines struct{ syncbuf.Buffer }

func (l *lines) all(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.Take()), "\n") {
		if s == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		out = append(out, m)
	}
	return out
}

func build(t *testing.T, opts map[string]any, out *lines) *Filter {
	t.Helper()
	o := DefaultOptions()
	if err := kernel.DecodeOptions(opts, o); err != nil {
		t.Fatal(err)
	}
	o.Logger = slog.New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f.(*Filter)
}

func call(f *Filter, side kernel.Side, req any, next kernel.Invoker) error {
	info := &kernel.CallInfo{Method: "Echo.Who", Side: side, Peer: "10.0.0.1:7000"}
	_, err := f.Invoke(context.Background(), info, req, func(ctx context.Context, info *kernel.CallInfo, req any) (any, error) {
		info.Attempt = 2
		return next(ctx, info, req)
	})
	return err
}

func answer(resp any, err error) kernel.Invoker {
	return func(context.Context, *kernel.CallInfo, any) (any, error) { return resp, err }
}

func TestOneLinePerCall(t *testing.T) {
	var out lines
	f := build(t, nil, &out)
	req := &echopb.Echo{Text: "hello"}
	resp := &echopb.Echo{Text: "hello, world"}
	call(f, kernel.ClientSide, req, answer(resp, nil))
	got := out.all(t)
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1", len(got))
	}
	l := got[0]
	for k, want := range map[string]any{
		"level": "INFO", "msg": "call", "side": "client", "method": "Echo.Who", "peer": "10.0.0.1:7000",
		"attempt": 2.0, "code": "OK", "req_bytes": float64(req.SizeVT()), "resp_bytes": float64(resp.SizeVT()),
	} {
		if l[k] != want {
			t.Errorf("%s = %v, want %v (line %v)", k, l[k], want, l)
		}
	}
	if _, ok := l["duration"]; !ok {
		t.Errorf("no duration: %v", l)
	}
	if _, ok := l["err"]; ok {
		t.Errorf("a success with err: %v", l)
	}
}

func TestFailuresAlwaysLoggedWithTheirError(t *testing.T) {
	var out lines
	f := build(t, map[string]any{"sample": 0}, &out)
	call(f, kernel.ServerSide, []byte("abc"), answer(nil, kernel.Errorf(kernel.Unavailable, "dependency down")))
	call(f, kernel.ServerSide, nil, answer("ok", nil))
	got := out.all(t)
	if len(got) != 1 {
		t.Fatalf("%d lines, want the failure's only: %v", len(got), got)
	}
	l := got[0]
	for k, want := range map[string]any{"level": "WARN", "side": "server", "code": "Unavailable", "err": "dependency down", "req_bytes": 3.0} {
		if l[k] != want {
			t.Errorf("%s = %v, want %v", k, l[k], want)
		}
	}
	if _, ok := l["attempt"]; ok {
		t.Errorf("a server line with an attempt: %v", l)
	}
}

func TestSampling(t *testing.T) {
	var out lines
	f := build(t, map[string]any{"sample": 0.25}, &out)
	draws := []float64{0.1, 0.3, 0.24, 0.25, 0.9, 0}
	f.rand = func() float64 { d := draws[0]; draws = draws[1:]; return d }
	for range 6 {
		call(f, kernel.ServerSide, nil, answer("unsized", nil))
	}
	if got := out.all(t); len(got) != 3 {
		t.Errorf("%d of 6 calls logged, want the 3 whose draw was below 0.25", len(got))
	} else if _, ok := got[0]["req_bytes"]; ok {
		t.Errorf("a message that reports no size got req_bytes: %v", got[0])
	}
}

func TestSlowCallsAlwaysLogged(t *testing.T) {
	var out lines
	f := build(t, map[string]any{"sample": 0, "slow": "5ms", "level": "DEBUG"}, &out)
	call(f, kernel.ServerSide, nil, answer("fast", nil))
	call(f, kernel.ServerSide, nil, func(context.Context, *kernel.CallInfo, any) (any, error) {
		time.Sleep(6 * time.Millisecond)
		return "slow", nil
	})
	got := out.all(t)
	if len(got) != 1 || got[0]["level"] != "DEBUG" {
		t.Errorf("lines %v; want the slow call's only, at DEBUG", got)
	}
}

func TestBadOptions(t *testing.T) {
	for want, opts := range map[string]map[string]any{
		`option "sample"`:      {"sample": 1.5},
		`option "slow"`:        {"slow": "-1s"},
		`option "level"`:       {"level": "LOUD"},
		`option "error_level"`: {"error_level": "x"},
	} {
		_, err := Factory.Build(opts, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("options %v: %v, want an error saying %s", opts, err, want)
		}
	}
}
