package main

import (
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// streamSystems are the streaming systems the tests run: kernrpc's
// default path over both transports, its tuned path, and grpc-go.
func streamSystems(t *testing.T) []*system {
	names := []string{"kernrpc", "kernrpc-tuned", "grpc", "bare-tcp-pb"}
	if runtime.GOOS == "linux" {
		names = append(names, "kernrpc-shm")
	}
	sys, err := lookupSystems(names)
	if err != nil {
		t.Fatal(err)
	}
	return sys
}

// TestStreamMode runs the stream mode at the smallest scale beside
// net/rpc, which cannot stream, and checks that every streaming system
// measured messages and costs in every cell, that net/rpc sat the mode
// out, and that the report has the stream tables, ratios and targets.
func TestStreamMode(t *testing.T) {
	sys, err := lookupSystems(append(systemNames(streamSystems(t)), "netrpc"))
	if err != nil {
		t.Fatal(err)
	}
	// The warm-up opens each stream: under -race, beside other packages'
	// tests, a stream's first message took over 130ms about once in 150
	// runs, which a 30ms warm-up and a 100ms window turned into "no call
	// completed".
	o := options{
		duration: time.Hour, streamDuration: 200 * time.Millisecond, warmup: 200 * time.Millisecond, rounds: 1,
		modes: []string{modeStream}, streamSizes: []int{16, 64 << 10}, streams: []int{1, 2},
		systems: sys, progress: io.Discard,
	}
	// -duration (an hour here) must not apply to the stream mode: if it
	// did, the context would end the run.
	b, err := runWithin(t, 60*time.Second, o)
	if err != nil {
		t.Fatalf("runBenchmarks: %v", err)
	}
	if left := liveChildren(t); len(left) > 0 {
		t.Errorf("server processes still running after the run: pids %v", left)
	}
	if len(b.cells) != 4 {
		t.Fatalf("cells %v, want 16 B and 64 KiB at 1 and 2 streams", b.cells)
	}
	for _, c := range b.cells {
		for i, r := range b.results[c] {
			name := sys[i].label + ", " + c.String()
			if !sys[i].streams {
				if r != nil {
					t.Errorf("%s: measured, but it cannot stream", name)
				}
				continue
			}
			switch {
			case r == nil:
				t.Errorf("%s: not measured", name)
			case r.calls == 0 || r.hist.n != r.calls || r.qps() <= 0 || r.mibPerSec(c.payload) <= 0:
				t.Errorf("%s: no messages measured (%d, histogram of %d)", name, r.calls, r.hist.n)
			case r.client.cpu <= 0 || r.server.cpu <= 0:
				t.Errorf("%s: CPU time not measured: client %s server %s", name, r.client.cpu, r.server.cpu)
			case r.client.mallocs == 0 && sys[i].name != "kernrpc-tuned":
				// The default paths decode every message into a new one.
				t.Errorf("%s: client allocations not measured", name)
			}
		}
	}

	md := b.markdown("go test")
	_, section, ok := strings.Cut(md, "## Server streaming")
	if !ok {
		t.Fatalf("report lacks the stream section:\n%s", md)
	}
	for _, want := range []string{"### stream, 16 B messages", "### stream, 64 KiB messages", "| streams", "MiB/s", "allocs",
		"Server log records at INFO and above in the measured windows: kernrpc 0 ", "Targets, default path against grpc-go",
		"- kernrpc / grpc-go, messages/s of 16 B messages, 2 streams: ", "- kernrpc / grpc-go, bytes/s of 64 KiB messages, 1 stream: ",
		"; bare TCP + protobuf did "} {
		if !strings.Contains(section, want) {
			t.Errorf("stream section lacks %q:\n%s", want, section)
		}
	}
	if title, _, _ := strings.Cut(md, "\n"); strings.Contains(title, "net/rpc") || !strings.HasPrefix(title, "# Server streams over loopback: kernrpc vs ") {
		t.Errorf("title %q: want server streams, without net/rpc, which sat the mode out", title)
	}
	if strings.Contains(section, "net/rpc |") || strings.Contains(section, "| net/rpc") {
		t.Errorf("stream section shows net/rpc, which sat the mode out:\n%s", section)
	}
	if strings.Contains(md, "## Long connections") {
		t.Errorf("report has the long mode, which did not run:\n%s", md)
	}
	rows := []string{"kernrpc / grpc-go | 16 B | 1", "kernrpc / grpc-go | 16 B | 2", "kernrpc / grpc-go | 64 KiB | 1",
		"kernrpc / grpc-go | 64 KiB | 2", "kernrpc tuned / grpc-go | 16 B | 1", "kernrpc tuned / kernrpc | 64 KiB | 2"}
	if runtime.GOOS == "linux" {
		rows = append(rows, "kernrpc/shm-ring / kernrpc | 64 KiB | 2")
		if !strings.Contains(section, "- kernrpc/shm-ring / grpc-go, bytes/s of 64 KiB messages, 2 streams: ") {
			t.Errorf("targets lack shm-ring's:\n%s", section)
		}
	}
	checkRowsInOrder(t, section, rows...)
	// Messages/s and CPU were measured on both sides of every ratio;
	// allocations may round to none on the tuned path.
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| kernrpc") {
			continue
		}
		f := splitRow(line)
		for _, i := range []int{3, 6, 7} {
			if len(f) != 8 || f[i] == "n/a" || f[i] == "0.00×" {
				t.Errorf("a ratio row lacks a figure that was measured (column %d): %s", i+1, line)
				break
			}
		}
	}
}

func systemNames(ss []*system) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.name)
	}
	return out
}

// TestStreamEndsAfterCount: every streaming system's server sends exactly
// the messages a counted request asks for, of the size asked, then ends
// the stream with OK; refuses a request no harness sends, saying why; and
// stops sending when the stream mode's caller closes its stream.
func TestStreamEndsAfterCount(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, sys := range streamSystems(t) {
		t.Run(sys.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv, err := startServer(ctx, exe, sys, "", serveOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := srv.stop(); err != nil {
					t.Error(err)
				}
			}()
			cli, err := sys.dial(ctx, srv.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			sc := cli.(streamClient)
			for _, size := range []int{0, 1000, 64 << 10} {
				st, err := sc.openStream(ctx, size, 300)
				if err != nil {
					t.Fatal(err)
				}
				got := 0
				for {
					n, err := st.recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatalf("size %d, message %d: %v", size, got, err)
					}
					if n != size {
						t.Fatalf("size %d, message %d: %d bytes", size, got, n)
					}
					got++
				}
				if got != 300 {
					t.Errorf("size %d: the stream ended after %d messages, want 300", size, got)
				}
				st.Close()
			}

			st, err := sc.openStream(ctx, maxPayload+1, 1)
			if err != nil {
				t.Fatal(err) // the server answers at its first read
			}
			defer st.Close()
			if n, err := st.recv(); err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "want \"<size> <count>\"") {
				t.Errorf("oversized stream request: %d bytes, %v; want the server's refusal", n, err)
			}
			st.Close()

			testStreamCallerCloses(ctx, t, srv, sc)
		})
	}
}

// testStreamCallerCloses: a stream caller opens its stream on the first
// call, reads one message per call, and closing it ends the stream on the
// server, so that a closed stream's handler does not keep sending into the
// next system's round.
func testStreamCallerCloses(ctx context.Context, t *testing.T, srv *childProcess, sc streamClient) {
	call, done := streamCaller(sc, 64)
	for i := range 1000 {
		if n, err := call(ctx); err != nil || n != 64 {
			t.Fatalf("call %d: %d bytes, %v", i, n, err)
		}
	}
	if err := done(); err != nil {
		t.Fatal(err)
	}
	// The server stops sending once it learns: its CPU time settles.
	deadline := time.Now().Add(5 * time.Second)
	prev, err := srv.stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for {
		time.Sleep(200 * time.Millisecond)
		cur, err := srv.stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := cur.cpu - prev.cpu; d < 20*time.Millisecond {
			break // under 10% of a core: idle
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server still spends %s of CPU per 200 ms after the stream was closed", cur.cpu-prev.cpu)
		}
		prev = cur
	}
	var none func() error
	if _, none = streamCaller(sc, 64); none() != nil {
		t.Error("done of a caller that never called failed")
	}
}

func TestParseStreamText(t *testing.T) {
	for _, c := range []struct {
		text        string
		size, count int
	}{{"16 0", 16, 0}, {"65536 300", 65536, 300}, {streamText(0, 1), 0, 1}} {
		size, count, err := parseStreamText(c.text)
		if err != nil || size != c.size || count != c.count {
			t.Errorf("parseStreamText(%q) = %d, %d, %v; want %d, %d", c.text, size, count, err, c.size, c.count)
		}
	}
	for _, bad := range []string{"", "16", "16 x", "x 1", "-1 1", "16 -1", "2000000 1", "16  1"} {
		if _, _, err := parseStreamText(bad); err == nil {
			t.Errorf("parseStreamText(%q) accepted it", bad)
		}
	}
}
