// Package presencepb holds messages generated with vtprotobuf's pool
// feature, with a bytes field that has presence and message fields nested
// in every container, for the protobuf codec's tests. Generated as
// internal/echopb is (see its gen.go for the tools).
package presencepb

//go:generate protoc --proto_path=../../../../.. --go_out=../../../../.. --go_opt=paths=source_relative plugins/codec/protobuf/internal/presencepb/presence.proto
//go:generate protoc --proto_path=../../../../.. --go-vtproto_out=../../../../.. --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size+pool+unmarshal_unsafe,pool=github.com/kernrpc/kernrpc/plugins/codec/protobuf/internal/presencepb.Outer,pool=github.com/kernrpc/kernrpc/plugins/codec/protobuf/internal/presencepb.Inner,pool=github.com/kernrpc/kernrpc/plugins/codec/protobuf/internal/presencepb.OneofOnly plugins/codec/protobuf/internal/presencepb/presence.proto
