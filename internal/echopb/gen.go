// Package echopb holds the echo message (echo.proto) used by the examples,
// the CLI's built-in echo service, tests and benchmarks.
//
// echo.pb.go and echo_vtproto.pb.go are generated and committed. The second
// holds vtprotobuf's reflection-free methods (MarshalToSizedBufferVT,
// UnmarshalVT, UnmarshalVTUnsafe, ResetVT...), which kernrpc's protobuf codec
// uses when a message has them. To regenerate both after editing echo.proto,
// install protoc and the Go plugins matching the versions in go.mod, with
// $(go env GOPATH)/bin on PATH:
//
//	apt-get install -y protobuf-compiler   # or any protoc release >= 3.12
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@v0.6.1-0.20240319094008-0393e58bdf10
//
// then run `go generate ./internal/echopb` from the module root. The proto is
// compiled relative to the module root so that it registers as
// "internal/echopb/echo.proto", a path no other module will also register.
package echopb

//go:generate protoc --proto_path=../.. --go_out=../.. --go_opt=paths=source_relative internal/echopb/echo.proto
//go:generate protoc --proto_path=../.. --go-vtproto_out=../.. --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size+pool+unmarshal_unsafe,pool=github.com/kernrpc/kernrpc/internal/echopb.Echo internal/echopb/echo.proto
