package main

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/types/descriptorpb"
)

const (
	contextPackage = protogen.GoImportPath("context")
	kernrpcPackage = protogen.GoImportPath("github.com/kernrpc/kernrpc")
)

// rpcKind is which sides of an RPC send a stream.
type rpcKind int

const (
	unary rpcKind = iota
	serverStreaming
	clientStreaming
	bidiStreaming
)

func kindOf(m *protogen.Method) rpcKind {
	switch cs, ss := m.Desc.IsStreamingClient(), m.Desc.IsStreamingServer(); {
	case cs && ss:
		return bidiStreaming
	case cs:
		return clientStreaming
	case ss:
		return serverStreaming
	}
	return unary
}

// serviceNames are the Go names generated for a service S.
type serviceNames struct {
	serviceConst string // S_ServiceName
	server       string // SServer
	register     string // RegisterSServer
	client       string // SClient
	newClient    string // NewSClient
}

func namesOf(s *protogen.Service) serviceNames {
	n := s.GoName
	return serviceNames{
		serviceConst: n + "_ServiceName",
		server:       n + "Server",
		register:     "Register" + n + "Server",
		client:       n + "Client",
		newClient:    "New" + n + "Client",
	}
}

// methodConst is the constant holding m's kernrpc name: S_M_FullMethodName.
func methodConst(m *protogen.Method) string {
	return m.Parent.GoName + "_" + m.GoName + "_FullMethodName"
}

// fullMethodName is m's kernrpc name: the service's full proto name, a
// dot and the method's proto name.
func fullMethodName(m *protogen.Method) string {
	return string(m.Parent.Desc.FullName()) + "." + string(m.Desc.Name())
}

// clientMethods are the names of the typed client's methods for m.
func clientMethods(m *protogen.Method) []string {
	if kindOf(m) == unary {
		return []string{m.GoName, m.GoName + "Async", m.GoName + "Func"}
	}
	return []string{m.GoName}
}

// generateServices writes NAME_kernrpc.pb.go for a file with services.
func generateServices(gen *protogen.Plugin, f *protogen.File) error {
	if len(f.Services) == 0 {
		return nil
	}
	if err := checkNames(gen, f); err != nil {
		return err
	}
	g := gen.NewGeneratedFile(f.GeneratedFilenamePrefix+"_kernrpc.pb.go", f.GoImportPath)
	g.P(strings.TrimSuffix(header(gen, f), "\n"))
	g.P()
	g.P("package ", f.GoPackageName)
	for _, s := range f.Services {
		genService(g, s)
	}
	return nil
}

func genService(g *protogen.GeneratedFile, s *protogen.Service) {
	n := namesOf(s)
	full := string(s.Desc.FullName())
	deprecated := s.Desc.Options().(*descriptorpb.ServiceOptions).GetDeprecated()

	g.P()
	prose(g, "The names of "+full+" and its methods, as servers register them and clients call them.")
	g.P("const (")
	constDeprecation(g, deprecated)
	g.P(n.serviceConst, " = ", quote(full))
	for _, m := range s.Methods {
		constDeprecation(g, methodDeprecated(m))
		g.P(methodConst(m), " = ", quote(fullMethodName(m)))
	}
	g.P(")")

	genServer(g, s, n, full, deprecated)
	genClient(g, s, n, full, deprecated)
}

func genServer(g *protogen.GeneratedFile, s *protogen.Service, n serviceNames, full string, deprecated bool) {
	g.P()
	prose(g, n.server+" is what a server of "+full+" implements; "+n.register+" registers an implementation on a kernrpc.Server.")
	paragraph(g, s.Comments.Leading)
	deprecation(g, deprecated)
	g.P("type ", n.server, " interface {")
	for i, m := range s.Methods {
		if i > 0 {
			g.P()
		}
		if m.Comments.Leading != "" {
			g.P(strings.TrimSuffix(m.Comments.Leading.String(), "\n"))
		} else {
			prose(g, m.GoName+" serves "+fullMethodName(m)+".")
		}
		if k := kindOf(m); k != unary {
			g.P("//")
			prose(g, serverKindDoc(m, k))
		}
		deprecation(g, methodDeprecated(m))
		g.P(serverSignature(g, m))
	}
	g.P("}")

	g.P()
	prose(g, n.register+" registers impl's methods on s under the names above: unary ones with kernrpc.Handle, streams with kernrpc.HandleServerStream, HandleClientStream or HandleBidiStream. Call it before s starts; it panics if one of the methods is registered already, as those do.")
	deprecation(g, deprecated)
	g.P("func ", n.register, "(s *", g.QualifiedGoIdent(kernrpcPackage.Ident("Server")), ", impl ", n.server, ") {")
	for _, m := range s.Methods {
		fn := map[rpcKind]string{unary: "Handle", serverStreaming: "HandleServerStream", clientStreaming: "HandleClientStream", bidiStreaming: "HandleBidiStream"}[kindOf(m)]
		g.P(kernrpcPackage.Ident(fn), "(s, ", methodConst(m), ", impl.", m.GoName, ")")
	}
	g.P("}")
}

// serverSignature is m's method in the server interface.
func serverSignature(g *protogen.GeneratedFile, m *protogen.Method) string {
	ctx := "ctx " + g.QualifiedGoIdent(contextPackage.Ident("Context"))
	in, out := g.QualifiedGoIdent(m.Input.GoIdent), g.QualifiedGoIdent(m.Output.GoIdent)
	st := "st " + g.QualifiedGoIdent(kernrpcPackage.Ident("ServerStreamOf")) + "[" + in + ", " + out + "]"
	switch kindOf(m) {
	case serverStreaming:
		return m.GoName + "(" + ctx + ", req *" + in + ", " + st + ") error"
	case clientStreaming:
		return m.GoName + "(" + ctx + ", " + st + ") (*" + out + ", error)"
	case bidiStreaming:
		return m.GoName + "(" + ctx + ", " + st + ") error"
	}
	return m.GoName + "(" + ctx + ", req *" + in + ") (*" + out + ", error)"
}

func serverKindDoc(m *protogen.Method, k rpcKind) string {
	in, out := m.Input.GoIdent.GoName, m.Output.GoIdent.GoName
	switch k {
	case serverStreaming:
		return m.GoName + " is server-streaming: it gets one " + in + " and sends " + out + " messages with st.Send; its return ends the stream (nil is OK, else a *kernel.Status)."
	case clientStreaming:
		return m.GoName + " is client-streaming: it reads " + in + " messages with st.Recv until io.EOF, then returns the one " + out + "."
	}
	return m.GoName + " is a bidirectional stream: it reads " + in + " messages with st.Recv (io.EOF once the client closed its side) and sends " + out + " messages with st.Send; its return ends the stream."
}

func genClient(g *protogen.GeneratedFile, s *protogen.Service, n serviceNames, full string, deprecated bool) {
	kc := g.QualifiedGoIdent(kernrpcPackage.Ident("Client"))
	g.P()
	prose(g, n.client+" calls "+full+" through a *kernrpc.Client, under the method names above: one method per RPC, and for each unary RPC its asynchronous (Async) and callback (Func) forms.")
	paragraph(g, s.Comments.Leading)
	deprecation(g, deprecated)
	g.P("type ", n.client, " struct {")
	g.P("c *", kc)
	g.P("}")
	g.P()
	prose(g, n.newClient+" returns a client of "+full+" that calls through c, a kernrpc.Client of a service that serves it. Typed clients of several services may share one c, and its connections.")
	deprecation(g, deprecated)
	g.P("func ", n.newClient, "(c *", kc, ") *", n.client, " {")
	g.P("return &", n.client, "{c: c}")
	g.P("}")
	for _, m := range s.Methods {
		switch kindOf(m) {
		case unary:
			genUnaryClient(g, n, m)
		default:
			genStreamClient(g, n, m)
		}
	}
}

func genUnaryClient(g *protogen.GeneratedFile, n serviceNames, m *protogen.Method) {
	ctx := g.QualifiedGoIdent(contextPackage.Ident("Context"))
	in, out := g.QualifiedGoIdent(m.Input.GoIdent), g.QualifiedGoIdent(m.Output.GoIdent)
	opt := g.QualifiedGoIdent(kernrpcPackage.Ident("CallOption"))
	call := g.QualifiedGoIdent(kernrpcPackage.Ident("Call"))
	name, dep := fullMethodName(m), methodDeprecated(m)
	v := localsFor(g, m)

	g.P()
	clientDoc(g, m, "calls "+name+" and waits for its answer.")
	deprecation(g, dep)
	g.P("func (", v.x, " *", n.client, ") ", m.GoName, "(", v.ctx, " ", ctx, ", ", v.req, " *", in, ", ", v.opts, " ...", opt, ") (*", out, ", error) {")
	g.P(v.resp, " := new(", out, ")")
	g.P("if ", v.err, " := ", v.x, ".c.Call(", v.ctx, ", ", methodConst(m), ", ", v.req, ", ", v.resp, ", ", v.opts, "...); ", v.err, " != nil {")
	g.P("return nil, ", v.err)
	g.P("}")
	g.P("return ", v.resp, ", nil")
	g.P("}")

	g.P()
	prose(g, m.GoName+"Async calls "+name+" and returns at once: the call is sent on done (a new channel if nil; it must have room) when it completes, with its Response a *"+m.Output.GoIdent.GoName+" and its Err the outcome.")
	deprecation(g, dep)
	g.P("func (", v.x, " *", n.client, ") ", m.GoName, "Async(", v.ctx, " ", ctx, ", ", v.req, " *", in, ", ", v.done, " chan *", call, ", ", v.opts, " ...", opt, ") *", call, " {")
	g.P("return ", v.x, ".c.Go(", v.ctx, ", ", methodConst(m), ", ", v.req, ", new(", out, "), ", v.done, ", ", v.opts, "...)")
	g.P("}")

	g.P()
	prose(g, m.GoName+"Func calls "+name+" and returns at once: fn runs with the answer, or the error, on a goroutine of its own when it completes.")
	deprecation(g, dep)
	g.P("func (", v.x, " *", n.client, ") ", m.GoName, "Func(", v.ctx, " ", ctx, ", ", v.req, " *", in, ", ", v.fn, " func(*", out, ", error), ", v.opts, " ...", opt, ") {")
	g.P(v.x, ".c.CallFunc(", v.ctx, ", ", methodConst(m), ", ", v.req, ", new(", out, "), func(", v.c, " *", call, ") {")
	g.P("if ", v.c, ".Err != nil {")
	g.P(v.fn, "(nil, ", v.c, ".Err)")
	g.P("return")
	g.P("}")
	g.P(v.fn, "(", v.c, ".Response.(*", out, "), nil)")
	g.P("}, ", v.opts, "...)")
	g.P("}")
}

// clientLocals are the names of a client method's receiver, parameters
// and variables.
type clientLocals struct{ x, ctx, req, opts, resp, err, done, fn, c string }

// localsFor names the locals of m's client methods so that none shadows a
// package their bodies refer to: the request and response messages may
// come from a Go package whose import path ends in /x or /req, which the
// file then imports as x or req, and new(x.Resp) inside a method whose
// receiver is x would not compile. Where nothing clashes the names are
// the plain ones (x, ctx, req, ...); a clashing one gets a _ appended.
func localsFor(g *protogen.GeneratedFile, m *protogen.Method) clientLocals {
	taken := map[string]bool{}
	for _, p := range []protogen.GoImportPath{m.Input.GoIdent.GoImportPath, m.Output.GoIdent.GoImportPath, kernrpcPackage, contextPackage} {
		// The qualifier the file uses for p ("" for the file's own package).
		if q := strings.TrimSuffix(g.QualifiedGoIdent(p.Ident("")), "."); q != "" {
			taken[q] = true
		}
	}
	name := func(base string) string {
		for taken[base] {
			base += "_"
		}
		return base
	}
	return clientLocals{x: name("x"), ctx: name("ctx"), req: name("req"), opts: name("opts"), resp: name("resp"),
		err: name("err"), done: name("done"), fn: name("fn"), c: name("c")}
}

func genStreamClient(g *protogen.GeneratedFile, n serviceNames, m *protogen.Method) {
	ctx := g.QualifiedGoIdent(contextPackage.Ident("Context"))
	in, out := g.QualifiedGoIdent(m.Input.GoIdent), g.QualifiedGoIdent(m.Output.GoIdent)
	opt := g.QualifiedGoIdent(kernrpcPackage.Ident("CallOption"))
	stream := g.QualifiedGoIdent(kernrpcPackage.Ident("ClientStreamOf")) + "[" + in + ", " + out + "]"
	name := fullMethodName(m)
	inName, outName := m.Input.GoIdent.GoName, m.Output.GoIdent.GoName
	v := localsFor(g, m)

	g.P()
	switch kindOf(m) {
	case serverStreaming:
		clientDoc(g, m, "opens "+name+", a server stream, with its one request: read the "+outName+" messages with Recv until io.EOF (the server ended the stream with OK) or another error (its status). Cancel ctx, or Close the stream, to leave early.")
		deprecation(g, methodDeprecated(m))
		g.P("func (", v.x, " *", n.client, ") ", m.GoName, "(", v.ctx, " ", ctx, ", ", v.req, " *", in, ", ", v.opts, " ...", opt, ") (", stream, ", error) {")
		g.P("return ", kernrpcPackage.Ident("OpenServerStream"), "[", in, ", ", out, "](", v.ctx, ", ", v.x, ".c, ", methodConst(m), ", ", v.req, ", ", v.opts, "...)")
	case clientStreaming:
		clientDoc(g, m, "opens "+name+", a client stream: send "+inName+" messages with Send, then CloseAndRecv for the one "+outName+".")
		deprecation(g, methodDeprecated(m))
		g.P("func (", v.x, " *", n.client, ") ", m.GoName, "(", v.ctx, " ", ctx, ", ", v.opts, " ...", opt, ") (", stream, ", error) {")
		g.P("return ", kernrpcPackage.Ident("OpenStream"), "[", in, ", ", out, "](", v.ctx, ", ", v.x, ".c, ", methodConst(m), ", ", v.opts, "...)")
	default:
		clientDoc(g, m, "opens "+name+", a bidirectional stream: Send "+inName+" messages and Recv "+outName+" messages in any order, and CloseSend when done sending; Recv returns io.EOF once the server ended the stream with OK.")
		deprecation(g, methodDeprecated(m))
		g.P("func (", v.x, " *", n.client, ") ", m.GoName, "(", v.ctx, " ", ctx, ", ", v.opts, " ...", opt, ") (", stream, ", error) {")
		g.P("return ", kernrpcPackage.Ident("OpenStream"), "[", in, ", ", out, "](", v.ctx, ", ", v.x, ".c, ", methodConst(m), ", ", v.opts, "...)")
	}
	g.P("}")
}

// clientDoc writes the doc comment of a client method: the .proto's
// comment, if any, then what the method does, wrapped.
func clientDoc(g *protogen.GeneratedFile, m *protogen.Method, what string) {
	if m.Comments.Leading != "" {
		g.P(strings.TrimSuffix(m.Comments.Leading.String(), "\n"))
		g.P("//")
	}
	prose(g, m.GoName+" "+what)
}

// prose writes text as a doc comment paragraph, wrapped.
func prose(g *protogen.GeneratedFile, text string) {
	for _, l := range wrap(text, 74) {
		g.P("// ", l)
	}
}

// paragraph writes c, a .proto comment, as a further paragraph of a doc
// comment.
func paragraph(g *protogen.GeneratedFile, c protogen.Comments) {
	if c != "" {
		g.P("//")
		g.P(strings.TrimSuffix(c.String(), "\n"))
	}
}

func deprecation(g *protogen.GeneratedFile, deprecated bool) {
	if deprecated {
		g.P("//")
		g.P("// Deprecated: Do not use.")
	}
}

// constDeprecation marks the constant that follows, in a const block, as
// deprecated.
func constDeprecation(g *protogen.GeneratedFile, deprecated bool) {
	if deprecated {
		g.P("// Deprecated: Do not use.")
	}
}

// methodDeprecated reports whether m, or its service, is deprecated: every
// name generated for either is.
func methodDeprecated(m *protogen.Method) bool {
	return m.Desc.Options().(*descriptorpb.MethodOptions).GetDeprecated() ||
		m.Parent.Desc.Options().(*descriptorpb.ServiceOptions).GetDeprecated()
}

// wrap splits text into lines of at most width bytes, at spaces.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}

func quote(s string) string { return fmt.Sprintf("%q", s) }
