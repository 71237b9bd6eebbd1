package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/internal/echofb"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// kernrpc's codecs, compared (-codecs): the echo service once per codec
// over tcp-lv, as systems beside kernrpc (which is protobuf), and each
// codec's own marshal and unmarshal cost, measured in this process with
// testing.Benchmark. The same measurements run as Go benchmarks:
//
//	go test -run '^$' -bench Codec ./benchmarks

// codecSystems are the systems -codecs adds: kernrpc with each codec but
// the default.
var codecSystems = []string{"kernrpc-json", "kernrpc-msgpack", "kernrpc-flatbuffers"}

// They use echopb.Echo, whose generated methods the flatbuffers codec needs
// (its Marshaler), with no server option.
func init() {
	for _, name := range codecSystems {
		codec := strings.TrimPrefix(name, "kernrpc-")
		registerKernRPC(name, "kernrpc/"+codec, kernrpcVariant{codec: codec, vt: true})
	}
}

// codecMessages are the two messages measured: a small one (a few fields,
// 16 bytes of payload) and a 64 KiB one.
var codecMessages = []struct {
	name    string
	payload int
}{{"small", 16}, {"64 KiB", 64 << 10}}

// codecRow is one line of the codec table: a codec and the Go type it
// decodes into. flatbuffers appears twice: with echopb.Echo, the type the
// echo service uses with every codec (payload read in place, text
// copied), and with the generated table echofb.Echo, read entirely in
// place.
type codecRow struct {
	id    string // in Go benchmark names
	label string // in the table
	codec string
	// value is what Marshal is given: a message holding payload.
	value func(c kernel.Codec, payload []byte) (any, error)
	// target is what Unmarshal decodes into, reused across calls as a
	// server reuses nothing but a client may.
	target func() any
	// read touches the decoded fields, as a handler would: for the
	// flatbuffers table, this is where the reading happens.
	read func(v any) int
}

const codecText = "hello, kernrpc"

func echoValue(_ kernel.Codec, payload []byte) (any, error) {
	return &echopb.Echo{Text: codecText, Payload: payload}, nil
}

func readEcho(v any) int { m := v.(*echopb.Echo); return len(m.Payload) + len(m.Text) }

var codecRows = []codecRow{
	{id: "protobuf", label: "protobuf", codec: "protobuf", value: echoValue, target: func() any { return new(echopb.Echo) }, read: readEcho},
	{id: "json", label: "json", codec: "json", value: echoValue, target: func() any { return new(echopb.Echo) }, read: readEcho},
	{id: "msgpack", label: "msgpack", codec: "msgpack", value: echoValue, target: func() any { return new(echopb.Echo) }, read: readEcho},
	{id: "flatbuffers", label: "flatbuffers (echopb.Echo)", codec: "flatbuffers", value: echoValue, target: func() any { return new(echopb.Echo) }, read: readEcho},
	{
		id: "flatbuffers-table", label: "flatbuffers (table)", codec: "flatbuffers",
		// Marshal of a table sends the buffer it is the root of, as a
		// handler answering with a received table does.
		value: func(c kernel.Codec, payload []byte) (any, error) {
			enc, err := c.Marshal(nil, &echopb.Echo{Text: codecText, Payload: payload})
			if err != nil {
				return nil, err
			}
			t := new(echofb.Echo)
			return t, c.Unmarshal(enc, t)
		},
		target: func() any { return new(echofb.Echo) },
		read:   func(v any) int { t := v.(*echofb.Echo); return len(t.PayloadBytes()) + len(t.Text()) },
	},
}

// codecBench is one benchmark of the table.
type codecBench struct {
	row     codecRow
	message string
	op      string // "marshal" or "unmarshal"
	run     func(b *testing.B)
}

// name is the benchmark's Go name, e.g. flatbuffers-table/64KiB/unmarshal.
func (cb codecBench) name() string {
	return cb.row.id + "/" + strings.ReplaceAll(cb.message, " ", "") + "/" + cb.op
}

// codecBenchmarks builds every benchmark of the table.
func codecBenchmarks() ([]codecBench, error) {
	var out []codecBench
	for _, row := range codecRows {
		c, err := kernel.NewCodec(row.codec, nil, "benchmarks")
		if err != nil {
			return nil, err
		}
		for _, m := range codecMessages {
			payload := bytes.Repeat([]byte{0xa5}, m.payload)
			v, err := row.value(c, payload)
			if err != nil {
				return nil, fmt.Errorf("%s, %s message: %w", row.label, m.name, err)
			}
			enc, err := c.Marshal(nil, v)
			if err != nil {
				return nil, fmt.Errorf("%s, %s message: %w", row.label, m.name, err)
			}
			out = append(out,
				codecBench{row, m.name, "marshal", marshalBench(c, v, len(enc))},
				codecBench{row, m.name, "unmarshal", unmarshalBench(c, enc, row)})
		}
	}
	return out, nil
}

// marshalBench encodes v into a buffer it fits in, as the kernel does into
// one the transport lends.
func marshalBench(c kernel.Codec, v any, size int) func(b *testing.B) {
	return func(b *testing.B) {
		buf := make([]byte, 0, size+64)
		b.ReportAllocs()
		b.SetBytes(int64(size))
		n := 0
		for b.Loop() {
			out, err := c.Marshal(buf[:0], v)
			if err != nil {
				b.Fatal(err)
			}
			n += len(out)
		}
		if n == 0 {
			b.Fatal("nothing encoded")
		}
	}
}

// unmarshalBench decodes enc and reads the fields.
func unmarshalBench(c kernel.Codec, enc []byte, row codecRow) func(b *testing.B) {
	return func(b *testing.B) {
		target := row.target()
		b.ReportAllocs()
		b.SetBytes(int64(len(enc)))
		n := 0
		for b.Loop() {
			if err := c.Unmarshal(enc, target); err != nil {
				b.Fatal(err)
			}
			n += row.read(target)
		}
		if n == 0 {
			b.Fatal("nothing decoded")
		}
	}
}

// codecResult is one measured benchmark.
type codecResult struct {
	row, message, op string
	nsPerOp          float64
	allocsPerOp      int64
	bytesPerOp       int64
}

// measureCodecs runs every codec benchmark with testing.Benchmark.
func measureCodecs(ctx context.Context, progress io.Writer) ([]codecResult, error) {
	benches, err := codecBenchmarks()
	if err != nil {
		return nil, err
	}
	var out []codecResult
	for i, cb := range benches {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r := testing.Benchmark(cb.run)
		if r.N == 0 {
			return nil, fmt.Errorf("codec benchmark %s failed; go test -run '^$' -bench 'Codec/%s' ./benchmarks shows why", cb.name(), cb.name())
		}
		res := codecResult{row: cb.row.label, message: cb.message, op: cb.op,
			nsPerOp: float64(r.T.Nanoseconds()) / float64(r.N), allocsPerOp: r.AllocsPerOp(), bytesPerOp: r.AllocedBytesPerOp()}
		out = append(out, res)
		fmt.Fprintf(progress, "codec %d/%d  %-26s %-7s %-9s %10.0f ns/op %4d allocs/op\n",
			i+1, len(benches), cb.row.label, cb.message, cb.op, res.nsPerOp, res.allocsPerOp)
	}
	return out, nil
}

// writeCodecTable renders the codec table, one row per codec and message,
// and checks the FlatBuffers zero-copy claim against protobuf.
func writeCodecTable(w *strings.Builder, results []codecResult) {
	w.WriteString("## Codecs: marshal and unmarshal of the echo message\n\n")
	w.WriteString("In the harness process, with testing.Benchmark. Marshal encodes into a buffer it fits in; " +
		"unmarshal decodes into a reused value and reads its fields. " +
		"The flatbuffers table row decodes into the generated echofb.Echo, read in place; its marshal sends a received table's buffer.\n\n")
	t := table{header: []string{"codec", "message", "marshal ns", "allocs", "B", "unmarshal ns", "allocs", "B"}}
	type key struct{ row, message, op string }
	byKey := map[key]codecResult{}
	for _, r := range results {
		byKey[key{r.row, r.message, r.op}] = r
	}
	for _, row := range codecRows {
		for _, m := range codecMessages {
			ma, un := byKey[key{row.label, m.name, "marshal"}], byKey[key{row.label, m.name, "unmarshal"}]
			t.add(row.label, m.name,
				fmtNs(ma.nsPerOp), fmt.Sprint(ma.allocsPerOp), fmt.Sprint(ma.bytesPerOp),
				fmtNs(un.nsPerOp), fmt.Sprint(un.allocsPerOp), fmt.Sprint(un.bytesPerOp))
		}
	}
	t.write(w)
	fb, pb := byKey[key{"flatbuffers (table)", "64 KiB", "unmarshal"}], byKey[key{"protobuf", "64 KiB", "unmarshal"}]
	if fb.nsPerOp > 0 {
		verdict := "met"
		if fb.allocsPerOp != 0 || pb.nsPerOp/fb.nsPerOp < 10 {
			verdict = "**not met**"
		}
		fmt.Fprintf(w, "FlatBuffers field access of the 64 KiB message: %s ns and %d allocations, %.0f× faster than protobuf unmarshal "+
			"(target: no allocation and at least 10×: %s).\n\n", fmtNs(fb.nsPerOp), fb.allocsPerOp, pb.nsPerOp/fb.nsPerOp, verdict)
	}
}

func fmtNs(ns float64) string {
	if ns < 100 {
		return fmt.Sprintf("%.1f", ns)
	}
	return fmt.Sprintf("%.0f", ns)
}
