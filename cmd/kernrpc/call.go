package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

const callSynopsis = `call [flags] ADDR SERVICE.METHOD ['{json}' | @FILE | -]
       kernrpc call -config FILE [-addr HOST:PORT] [-method Echo.Echo] [-text hello]

The first form finds the method's descriptor through the server's reflection
service (or -protoset), builds the request from JSON (the argument, -d, a file
with @FILE, or standard input with -), calls it and prints the response as
JSON; no request is the empty message. A server stream prints each message;
a client or bidi stream sends each JSON value given, one after another (none
without a request). ADDR may be a service name resolved through -registry
or -config's registry; with -addr, the arguments are SERVICE.METHOD [JSON].
A non-OK status prints its code and message and exits 1.

The second form, with no arguments, calls the built-in echo service with an
echo message carrying -text. Each form refuses the flags only the other reads
(-d, -registry and -protoset; -text and -method).`

func call(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("call", callSynopsis, stderr)
	var d dialFlags
	d.add(fs, true)
	addr := fs.String("addr", "", "call this address (first form: instead of ADDR; second form: instead of resolving the config's service)")
	method := fs.String("method", "Echo.Echo", "second form only: method to call (the built-in echo service serves Echo.Echo)")
	text := fs.String("text", "hello", "second form only: text to send in the echo message")
	data := fs.String("d", "", "first form only: the request: JSON, @FILE, or - for standard input (instead of the argument)")
	pos, err := parseAnywhere(fs, args, 0, 3)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if len(pos) == 0 {
		// The echo form reads none of these: ignoring one would call
		// something other than what was asked.
		for _, name := range []string{"d", "registry", "protoset"} {
			if set[name] {
				return usageProblem(fs, fmt.Sprintf("-%s is for the form with arguments (ADDR SERVICE.METHOD [JSON]); "+
					"without arguments call sends the built-in echo service an echo message carrying -text, through -config's registry or to -addr", name))
			}
		}
		return callEcho(ctx, &d, *addr, *method, *text, stdout)
	}
	for _, name := range []string{"text", "method"} {
		if set[name] {
			return usageProblem(fs, fmt.Sprintf("-%s is for the echo form (call -config FILE with no arguments); "+
				"with arguments the method is SERVICE.METHOD and the request its JSON (the argument or -d)", name))
		}
	}
	target := *addr
	if target == "" {
		target, pos = pos[0], pos[1:]
	}
	if len(pos) == 0 || len(pos) > 2 {
		return usageProblem(fs, "want ADDR SERVICE.METHOD [JSON] (or -addr ADDR SERVICE.METHOD [JSON])")
	}
	var reqArg string
	switch {
	case len(pos) == 2 && *data != "":
		return usageProblem(fs, "the request is given twice: as an argument and with -d; pass one")
	case len(pos) == 2:
		reqArg = pos[1]
	default:
		reqArg = *data
	}
	req, err := readData(reqArg, stdin)
	if err != nil {
		return err
	}
	e, err := d.dial(target)
	if err != nil {
		return err
	}
	defer e.Close()
	return callGeneric(ctx, e, &d, pos[0], req, stdout)
}

func callGeneric(ctx context.Context, e *endpoint, d *dialFlags, method string, req []byte, stdout io.Writer) error {
	g := generic.NewClient(e.cli, e.source)
	lctx, cancel := context.WithTimeout(ctx, d.timeout)
	md, err := g.Method(lctx, method)
	cancel()
	if err != nil {
		return err
	}
	print := func(b []byte) error { return printJSON(stdout, b) }
	opts := d.callOptions()
	switch generic.KindOf(md) {
	case generic.Unary:
		resp, err := g.CallJSON(ctx, method, req, opts...)
		if err != nil {
			return e.callError(method, err)
		}
		return print(resp)
	case generic.ServerStreaming:
		if err := g.ServerStreamJSON(ctx, method, req, print, opts...); err != nil {
			return e.callError(method, err)
		}
		return nil
	}
	msgs, err := jsonValues(ctx, g, md.Input(), req)
	if err != nil {
		return err
	}
	if err := stream(ctx, g, method, msgs, print, opts); err != nil {
		return e.callError(method, err)
	}
	return nil
}

// jsonValues splits a client stream's messages: JSON values one after
// another ({"a":1} {"a":2}), each checked against the input message.
func jsonValues(ctx context.Context, g *generic.Client, in protoreflect.MessageDescriptor, data []byte) ([][]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var out [][]byte
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("message %d of the stream: %w: %v", len(out)+1, generic.ErrBadJSON, err)
		}
		if _, err := g.DecodeJSON(ctx, in, raw); err != nil {
			return nil, fmt.Errorf("message %d of the stream: %w", len(out)+1, err)
		}
		out = append(out, raw)
	}
}

// stream sends msgs on a client or bidi stream while printing what comes
// back: sending all before reading could fill both flow-control windows.
func stream(ctx context.Context, g *generic.Client, method string, msgs [][]byte, print func([]byte) error, opts []kernrpc.CallOption) error {
	st, err := g.OpenStream(ctx, method, opts...)
	if err != nil {
		return err
	}
	defer st.Close()
	sent := make(chan error, 1)
	go func() {
		for _, b := range msgs {
			m, _ := g.DecodeJSON(ctx, st.Method().Input(), b) // checked by jsonValues
			if err := st.Send(m); err != nil {
				if errors.Is(err, io.EOF) { // the server ended the stream: Recv says how
					err = nil
				}
				sent <- err
				return
			}
		}
		sent <- st.CloseSend()
	}()
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			st.Close()
			<-sent
			return err
		}
		b, err := g.EncodeJSON(ctx, m)
		if err == nil {
			err = print(b)
		}
		if err != nil {
			st.Close()
			<-sent
			return err
		}
	}
	return <-sent
}

// printJSON writes a message's JSON indented, one value after another.
func printJSON(w io.Writer, b []byte) error {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

// callEcho is call's second form: the built-in echo service, by config.
func callEcho(ctx context.Context, d *dialFlags, addr, method, text string, stdout io.Writer) error {
	cfg, err := loadConfig(d.config)
	if err != nil {
		return err
	}
	if addr != "" {
		cfg.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{
			"namespace": "kernrpc-call", "static": map[string]any{cfg.Service: []any{addr}}}}
	} else if cfg.Registry.Name == "memory" && !listsStatic(cfg.Registry.Options, cfg.Service) {
		return fmt.Errorf("no address to call: %s names registry \"memory\", which lives inside one process, and lists no static address for %q; "+
			"pass -addr HOST:PORT (the address \"kernrpc serve\" printed), or list the server under registry.options.static.%s",
			cfg.Source, cfg.Service, cfg.Service)
	}
	if d.codec != "" {
		cfg.Codec = kernrpc.PluginConfig{Name: d.codec}
	}
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	var resp echopb.Echo
	start := time.Now()
	if err := cli.Call(ctx, method, &echopb.Echo{Text: text}, &resp, d.callOptions()...); err != nil {
		if kernel.CodeOf(err) == kernel.Unavailable && addr == "" {
			return fmt.Errorf("%w; to call one server directly, pass -addr HOST:PORT", err)
		}
		return err
	}
	fmt.Fprintf(stdout, "%s answered %q in %s\n", method, resp.Text, time.Since(start).Round(time.Microsecond))
	return nil
}
