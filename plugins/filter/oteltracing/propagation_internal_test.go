package oteltracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

const validTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestParseTraceparent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		fast    bool // parseTraceparent takes it
		valid   bool // extractRemote finds a span context, fast or through the propagator
		sampled bool
	}{
		{"sampled", validTP, true, true, true},
		{"unsampled", strings.TrimSuffix(validTP, "01") + "00", true, true, false},
		{"sampled and random (W3C Level 2)", strings.TrimSuffix(validTP, "01") + "03", true, true, true},
		{"a reserved flag bit", strings.TrimSuffix(validTP, "01") + "05", false, false, false},
		{"upper-case hex", strings.ToUpper(validTP), false, false, false},
		{"zero trace ID", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", false, false, false},
		{"zero span ID", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false, false, false},
		{"short", validTP[:54], false, false, false},
		{"bad separator", strings.Replace(validTP, "-", "_", 1), false, false, false},
		{"non-hex", strings.Replace(validTP, "4bf9", "4bg9", 1), false, false, false},
		{"version ff", "ff" + validTP[2:], false, false, false},
		{"a later version with more fields", "01" + validTP[2:] + "-what-comes-next", false, true, true},
		{"empty", "", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, ok := parseTraceparent(tc.in)
			if ok != tc.fast {
				t.Errorf("parseTraceparent(%q) ok = %v, want %v", tc.in, ok, tc.fast)
			}
			if ok && formatTraceparent(sc) != tc.in {
				t.Errorf("formatTraceparent(parse(%q)) = %q", tc.in, formatTraceparent(sc))
			}
			got, raw, valid := extractRemote(kernel.Metadata{traceparentKey: tc.in})
			if valid != tc.valid || valid && got.IsSampled() != tc.sampled || valid && !got.IsRemote() {
				t.Errorf("extractRemote(%q) = %+v valid %v, want valid %v sampled %v remote", tc.in, got, valid, tc.valid, tc.sampled)
			}
			if want := map[bool]string{true: tc.in, false: ""}[tc.fast]; raw != want {
				t.Errorf("extractRemote(%q) raw = %q, want %q", tc.in, raw, want)
			}
		})
	}
}

// valuerCtx asks a ContextValuer for what it does not hold, as the
// engine's call context does.
type valuerCtx struct {
	context.Context
	v    kernel.ContextValuer
	info *kernel.CallInfo
}

func (c valuerCtx) Value(key any) any {
	if v, ok := c.v.CallValue(c.info, key); ok {
		return v
	}
	return c.Context.Value(key)
}

func TestTracestatePassesThrough(t *testing.T) {
	for _, under := range []string{"a server asking CallValue", "a bare context"} {
		t.Run(under, func(t *testing.T) {
			f := &Filter{sampler: sampleNever}
			md := kernel.Metadata{traceparentKey: validTP, tracestateKey: "vendor=abc,other=1"}
			info := &kernel.CallInfo{Method: "A.B", Side: kernel.ServerSide, Metadata: md}
			var ctx context.Context = context.Background()
			if under != "a bare context" {
				ctx = valuerCtx{ctx, f, info}
			}
			var sent kernel.Metadata
			_, err := f.Invoke(ctx, info, nil, func(ctx context.Context, _ *kernel.CallInfo, _ any) (any, error) {
				if ts := trace.SpanContextFromContext(ctx).TraceState().String(); ts != "vendor=abc,other=1" {
					t.Errorf("handler's tracestate %q", ts)
				}
				if _, own := ctx.(*remoteCtx); own == (under != "a bare context") {
					t.Errorf("the handler's context is %T", ctx)
				}
				out := &kernel.CallInfo{Method: "C.D", Side: kernel.ClientSide}
				_, err := f.Invoke(ctx, out, nil, func(context.Context, *kernel.CallInfo, any) (any, error) { return 1, nil })
				sent = out.Metadata
				return 1, err
			})
			if err != nil {
				t.Fatal(err)
			}
			if sent[traceparentKey] != validTP || sent[tracestateKey] != "vendor=abc,other=1" {
				t.Errorf("the handler's call sent %v, want the caller's traceparent and tracestate", sent)
			}
		})
	}
}

// otherKey puts a value of its own under the remote span context.
type otherKey struct{}

// A remoteCtx is read back as otel's current span: if a later otel looked
// spans up otherwise, the filter would fall back to otel's own way, and
// this says so.
func TestRemoteCtxIsOtelsCurrentSpan(t *testing.T) {
	if !remoteCtxWorks {
		t.Fatal("otel does not find a remoteCtx's span; withRemote falls back to trace.ContextWithRemoteSpanContext")
	}
	sc, _ := parseTraceparent(validTP)
	ctx := withRemote(context.WithValue(context.Background(), otherKey{}, 1), sc, validTP, "")
	if got := trace.SpanContextFromContext(ctx); !got.Equal(sc) {
		t.Errorf("span context %+v, want %+v", got, sc)
	}
	if ctx.Value(otherKey{}) != 1 {
		t.Error("a remoteCtx hides its parent's values")
	}
}

func TestMethodCacheIsBounded(t *testing.T) {
	var c methodCache
	for i := range maxCachedMethods + 10 {
		m := "S.M" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i)
		if got := c.get(m); got.name != m {
			t.Fatalf("get(%q).name = %q", m, got.name)
		}
	}
	if n := c.n.Load(); n != maxCachedMethods {
		t.Errorf("%d methods cached, want the bound %d", n, maxCachedMethods)
	}
	if a, b := c.get("S.Ma0"), c.get("S.Ma0"); a != b {
		t.Error("a cached method built twice")
	}
}

func itoa(i int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}

func TestRatioSamplingByTraceID(t *testing.T) {
	f, err := New(&Options{Span: "call", Exporter: "none", Sampler: "ratio", Ratio: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	ff := f.(*Filter)
	low, _ := trace.TraceIDFromHex("00000000000000000000000000000001")  // below half: sampled
	high, _ := trace.TraceIDFromHex("0000000000000000ffffffffffffffff") // above: not
	if !ff.traceIDSampled(low) || ff.traceIDSampled(high) {
		t.Errorf("ratio 0.5: low sampled %v, high sampled %v; want true, false", ff.traceIDSampled(low), ff.traceIDSampled(high))
	}
	sampledParent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: high, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	if ff.sampleChild(sampledParent) {
		t.Error("ratio follows the parent's flag; it must decide by trace ID")
	}
	n := 0
	for range 10000 {
		if ff.sampleRoot() {
			n++
		}
	}
	if n < 4000 || n > 6000 {
		t.Errorf("ratio 0.5 sampled %d of 10000 roots", n)
	}
}
