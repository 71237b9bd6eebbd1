// Package sizeonlypb holds a message generated with vtprotobuf's size and
// unmarshal features only (SizeVT, no MarshalToSizedBufferVT), for the
// protobuf codec's tests. Generated as internal/echopb is (see its gen.go
// for the tools).
package sizeonlypb

//go:generate protoc --proto_path=../../../../.. --go_out=../../../../.. --go_opt=paths=source_relative plugins/codec/protobuf/internal/sizeonlypb/sizeonly.proto
//go:generate protoc --proto_path=../../../../.. --go-vtproto_out=../../../../.. --go-vtproto_opt=paths=source_relative,features=size+unmarshal plugins/codec/protobuf/internal/sizeonlypb/sizeonly.proto
