package oteltracing

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/kernrpc/kernrpc/kernel"
)

// kernrpc's own attributes, under rpc.kernrpc as the conventions name a
// system's own (rpc.grpc.*, rpc.jsonrpc.*).
const (
	attemptKey      = attribute.Key("rpc.kernrpc.attempt")
	requestSizeKey  = attribute.Key("rpc.kernrpc.request.size")
	responseSizeKey = attribute.Key("rpc.kernrpc.response.size")
)

// systemName is rpc.system.name: kernrpc is not one of the convention's
// listed systems, which allows others.
var systemName = semconv.RPCSystemNameKey.String("kernrpc")

// maxCachedMethods bounds the method cache: a server is sent whatever
// method names its clients make up, and each cached one is kept for good.
// Past the bound, a span's start options are built for it alone.
const maxCachedMethods = 4096

// methodSpans is what every span of one method starts with, built once.
type methodSpans struct {
	name                          string // the span name: the method, as the conventions say
	attemptName                   string
	client, clientAttempt, server []trace.SpanStartOption
}

func newMethodSpans(method string) *methodSpans {
	attrs := []attribute.KeyValue{systemName, semconv.RPCMethodKey.String(method)}
	with := trace.WithAttributes(attrs...)
	return &methodSpans{
		name:          method,
		attemptName:   method + " attempt",
		client:        []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), with},
		clientAttempt: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), with},
		server:        []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), with},
	}
}

// methodCache keeps each method's methodSpans, found without a lock.
type methodCache struct {
	m sync.Map // method → *methodSpans
	n atomic.Int32
}

func (c *methodCache) get(method string) *methodSpans {
	if v, ok := c.m.Load(method); ok {
		return v.(*methodSpans)
	}
	ms := newMethodSpans(method)
	if c.n.Load() >= maxCachedMethods {
		return ms
	}
	if v, loaded := c.m.LoadOrStore(method, ms); loaded {
		return v.(*methodSpans)
	}
	c.n.Add(1)
	return ms
}

// hostPort splits an address into host and port; an address without a
// port (a Unix socket's path) is all host.
func hostPort(addr string) (string, int) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return addr, 0
	}
	return host, port
}

// endClient sets what a client span learns once next returned, and ends
// it.
func endClient(span trace.Span, info *kernel.CallInfo, err error) {
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, semconv.RPCResponseStatusCode(kernel.CodeOf(err).String()))
	addr := info.Peer
	if info.Instance != nil {
		addr = info.Instance.Address
	}
	if addr != "" {
		host, port := hostPort(addr)
		attrs = append(attrs, semconv.ServerAddress(host))
		if port > 0 {
			attrs = append(attrs, semconv.ServerPort(port))
		}
	}
	if info.Attempt > 0 {
		attrs = append(attrs, attemptKey.Int(info.Attempt))
	}
	attrs = appendSizes(attrs, info)
	span.SetAttributes(attrs...)
	if err != nil {
		recordError(span, err)
	}
	span.End()
}

// endServer sets what a server span learns once the handler returned, and
// ends it.
func endServer(span trace.Span, err error) {
	code := kernel.CodeOf(err)
	span.SetAttributes(semconv.RPCResponseStatusCode(code.String()))
	if err != nil && serverFault(code) {
		recordError(span, err)
	}
	span.End()
}

// panicked is what a span ends with when the rest of the chain panicked
// under it: the server answers such a call Internal.
func panicked(info *kernel.CallInfo) error {
	return kernel.Errorf(kernel.Internal, "%s panicked", info.Method)
}

// serverAttributes are a server span's attributes beyond its method's.
func serverAttributes(info *kernel.CallInfo) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 3)
	if info.Peer != "" {
		host, port := hostPort(info.Peer)
		attrs = append(attrs, semconv.NetworkPeerAddress(host))
		if port > 0 {
			attrs = append(attrs, semconv.NetworkPeerPort(port))
		}
	}
	return appendSizes(attrs, info)
}

func appendSizes(attrs []attribute.KeyValue, info *kernel.CallInfo) []attribute.KeyValue {
	if info.RequestSize > 0 {
		attrs = append(attrs, requestSizeKey.Int(info.RequestSize))
	}
	if info.ResponseSize > 0 {
		attrs = append(attrs, responseSizeKey.Int(info.ResponseSize))
	}
	return attrs
}

// recordError records err on span as a failure with its status code.
func recordError(span trace.Span, err error) {
	st := kernel.StatusOf(err)
	span.RecordError(err, trace.WithAttributes(semconv.ErrorTypeKey.String(st.Code.String())))
	span.SetAttributes(semconv.ErrorTypeKey.String(st.Code.String()))
	span.SetStatus(codes.Error, st.Message)
}

// serverFault reports whether code, answered by a server, is the server's
// failure rather than the caller's: the conventions' rule for gRPC, whose
// codes kernrpc shares. A client span fails for every code but OK.
func serverFault(code kernel.Code) bool {
	switch code {
	case kernel.Unknown, kernel.DeadlineExceeded, kernel.Unimplemented, kernel.Internal, kernel.Unavailable, kernel.DataLoss:
		return true
	}
	return false
}
