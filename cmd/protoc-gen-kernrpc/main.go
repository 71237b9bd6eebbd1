// Command protoc-gen-kernrpc is a protoc plugin that generates kernrpc
// code for the services of .proto files, next to protoc-gen-go's output
// and in the same Go package:
//
//   - NAME_kernrpc.pb.go, for a file with services: the service's and its
//     methods' names as constants, a server interface with its register
//     function, and a typed client whose methods call each RPC in the three
//     call models (Say, SayAsync, SayFunc) or open its stream;
//   - NAME_vtproto.pb.go, for a file with messages: vtprotobuf's
//     reflection-free methods (SizeVT, MarshalToSizedBufferVT, UnmarshalVT,
//     UnmarshalVTUnsafe...), which kernrpc's protobuf codec uses when a
//     message has them. The generator is vtprotobuf's own, linked in.
//
// Run it with protoc-gen-go, both on PATH:
//
//	protoc --go_out=. --go_opt=paths=source_relative \
//	       --kernrpc_out=. --kernrpc_opt=paths=source_relative x/y.proto
//
// It takes protoc-gen-go's options for where files go (paths=import or
// source_relative, module=PREFIX, Mx/y.proto=IMPORTPATH) and these:
//
//	vtproto=true                 false: no NAME_vtproto.pb.go (when protoc-gen-go-vtproto runs too)
//	vtproto_features=marshal+unmarshal+unmarshal_unsafe+size+pool
//	                             vtprotobuf's features, '+'-separated; also clone, equal, marshal_strict
//	vtproto_pool=PATTERN         messages to pool (import/path.Message, * wildcards), repeatable;
//	                             pooled messages get ResetVT, which the codec uses to reuse their bytes
//	vtproto_pool_exclude=PATTERN messages not to pool, repeatable
//
// docs/codegen.md has the details: what is generated, the naming rules
// and the fast path.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/pluginpb"
)

// version is protoc-gen-kernrpc's, written into every file it generates.
// It is a constant, not the module version, so that the output depends
// only on the input: bump it when the generated code changes.
const version = "v0.1.1"

const usage = `protoc-gen-kernrpc %s: a protoc plugin that generates kernrpc services
(NAME_kernrpc.pb.go) and vtprotobuf's fast-path methods (NAME_vtproto.pb.go),
next to protoc-gen-go's NAME.pb.go. protoc runs it:

  protoc --go_out=. --go_opt=paths=source_relative \
         --kernrpc_out=. --kernrpc_opt=paths=source_relative x/y.proto

Options (--kernrpc_opt=k=v,k=v), beside protoc-gen-go's paths=, module= and M:
  vtproto=true|false            generate NAME_vtproto.pb.go (default true)
  vtproto_features=F+F          vtprotobuf features (default %s)
  vtproto_pool=PATTERN          messages to pool (import/path.Message, * wildcards); repeatable
  vtproto_pool_exclude=PATTERN  messages not to pool; repeatable

Flags: --version prints the version, -h the text you are reading.
See docs/codegen.md in github.com/kernrpc/kernrpc.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the plugin: with no arguments it reads a CodeGeneratorRequest on
// stdin and writes the response on stdout, as protoc expects. It returns
// the exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "--version", "-version":
			fmt.Fprintln(stdout, "protoc-gen-kernrpc", version)
			return 0
		case "-h", "-help", "--help":
			fmt.Fprintf(stdout, usage, version, defaultFeatures)
			return 0
		}
		fmt.Fprintf(stderr, "protoc-gen-kernrpc: unknown argument %q: protoc runs this plugin with none (options go in --kernrpc_opt)\n\n", args[0])
		fmt.Fprintf(stderr, usage, version, defaultFeatures)
		return 2
	}
	if err := serve(stdin, stdout); err != nil {
		fmt.Fprintln(stderr, "protoc-gen-kernrpc:", err)
		return 1
	}
	return 0
}

// serve answers one CodeGeneratorRequest. A problem with the .proto files
// goes back to protoc in the response (which prints it, naming the
// plugin); only a request that cannot be read or answered fails here.
func serve(stdin io.Reader, stdout io.Writer) error {
	in, err := io.ReadAll(stdin)
	if err != nil {
		return fmt.Errorf("read the request: %w", err)
	}
	if len(in) == 0 {
		return errors.New("no request on stdin: this is a protoc plugin, run it through protoc --kernrpc_out=DIR (see -h)")
	}
	req := new(pluginpb.CodeGeneratorRequest)
	if err := proto.Unmarshal(in, req); err != nil {
		return fmt.Errorf("decode the request (%d bytes) from protoc: %w", len(in), err)
	}
	out, err := proto.Marshal(generate(req))
	if err != nil {
		return fmt.Errorf("encode the response: %w", err)
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("write the response: %w", err)
	}
	return nil
}
