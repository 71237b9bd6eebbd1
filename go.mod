module github.com/kernrpc/kernrpc

go 1.26.0

require (
	github.com/google/flatbuffers v25.12.19+incompatible
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10
	github.com/vmihailenco/msgpack/v5 v5.4.1
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.48.0
	google.golang.org/protobuf v1.36.12
)

require github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
