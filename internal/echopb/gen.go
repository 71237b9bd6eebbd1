// Package echopb holds the echo message (echo.proto) used by the examples,
// the CLI's built-in echo service, tests and benchmarks.
//
// echo.pb.go is generated and committed. To regenerate it after editing
// echo.proto, install protoc and the Go plugin matching the protobuf runtime
// in go.mod, with $(go env GOPATH)/bin on PATH:
//
//	apt-get install -y protobuf-compiler   # or any protoc release >= 3.12
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//
// then run `go generate ./internal/echopb` from the module root. The proto is
// compiled relative to the module root so that it registers as
// "internal/echopb/echo.proto", a path no other module will also register.
package echopb

//go:generate protoc --proto_path=../.. --go_out=../.. --go_opt=paths=source_relative internal/echopb/echo.proto
