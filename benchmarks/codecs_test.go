package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// BenchmarkCodec is the codec table as Go benchmarks:
//
//	go test -run '^$' -bench Codec ./benchmarks
func BenchmarkCodec(b *testing.B) {
	benches, err := codecBenchmarks()
	if err != nil {
		b.Fatal(err)
	}
	for _, cb := range benches {
		b.Run(cb.name(), cb.run)
	}
}

// The zero-copy claim the table checks, as a test that cannot pass by
// timing: decoding the 64 KiB message into the generated table and reading
// its fields allocates nothing.
func TestFlatBuffersTableFieldAccessAllocatesNothing(t *testing.T) {
	benches, err := codecBenchmarks()
	if err != nil {
		t.Fatal(err)
	}
	for _, cb := range benches {
		if cb.row.id == "flatbuffers-table" && cb.op == "unmarshal" {
			if r := testing.Benchmark(cb.run); r.N == 0 || r.AllocsPerOp() != 0 {
				t.Errorf("%s message: %d runs, %d allocations per op; want 0 allocations", cb.message, r.N, r.AllocsPerOp())
			}
		}
	}
}

func TestCodecTableHasEveryRow(t *testing.T) {
	var results []codecResult
	for _, row := range codecRows {
		for _, m := range codecMessages {
			for _, op := range []string{"marshal", "unmarshal"} {
				results = append(results, codecResult{row: row.label, message: m.name, op: op, nsPerOp: 1000, allocsPerOp: 1})
			}
		}
	}
	var w strings.Builder
	writeCodecTable(&w, results)
	for _, want := range []string{"| protobuf", "| json", "| msgpack", "| flatbuffers (echopb.Echo)", "| flatbuffers (table)", "64 KiB", "**not met**"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("codec table lacks %q:\n%s", want, w.String())
		}
	}
	if _, err := measureCodecs(canceled(), io.Discard); err == nil {
		t.Error("measureCodecs ran on a cancelled context")
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
