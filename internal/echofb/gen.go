// Package echofb holds the echo message as a FlatBuffers table (echo.fbs),
// for the flatbuffers codec: a handler that takes *echofb.Echo reads its
// fields in place from the received bytes.
//
// Echo.go is generated and committed. To regenerate it after editing
// echo.fbs, install flatc and run `go generate ./internal/echofb` from the
// module root:
//
//	apt-get install -y flatbuffers-compiler   # flatc 2.0.8, as Echo.go was made with
//
// The generated code uses only the runtime API that has been stable since
// flatc 2.0 (Table, Builder); it is tested against the runtime pinned in
// go.mod, github.com/google/flatbuffers v25.12.19.
//
// verify.go is written by hand: it checks that every field of a received
// Echo lies inside its buffer before anything reads it.
package echofb

//go:generate flatc --go --go-namespace echofb -o .. echo.fbs
