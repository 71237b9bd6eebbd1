// Package all registers every built-in kernrpc plugin. Import it for its
// side effects in binaries that want every built-in plugin:
//
//	import _ "github.com/kernrpc/kernrpc/plugins/all"
//
// Libraries should import only the plugins they need, so that their users
// do not link the others.
package all

import (
	_ "github.com/kernrpc/kernrpc/plugins/balancer/consistenthash"
	_ "github.com/kernrpc/kernrpc/plugins/balancer/leastload"
	_ "github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
	_ "github.com/kernrpc/kernrpc/plugins/balancer/weightedrandom"
	_ "github.com/kernrpc/kernrpc/plugins/codec/flatbuffers"
	_ "github.com/kernrpc/kernrpc/plugins/codec/json"
	_ "github.com/kernrpc/kernrpc/plugins/codec/msgpack"
	_ "github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	_ "github.com/kernrpc/kernrpc/plugins/filter/accesslog"
	_ "github.com/kernrpc/kernrpc/plugins/filter/auth"
	_ "github.com/kernrpc/kernrpc/plugins/filter/breaker"
	_ "github.com/kernrpc/kernrpc/plugins/filter/hedge"
	_ "github.com/kernrpc/kernrpc/plugins/filter/overload"
	_ "github.com/kernrpc/kernrpc/plugins/filter/recovery"
	_ "github.com/kernrpc/kernrpc/plugins/filter/retry"
	_ "github.com/kernrpc/kernrpc/plugins/filter/timeout"
	_ "github.com/kernrpc/kernrpc/plugins/filter/tokenbucket"
	_ "github.com/kernrpc/kernrpc/plugins/registry/memory"
	_ "github.com/kernrpc/kernrpc/plugins/transport/faulty"
	_ "github.com/kernrpc/kernrpc/plugins/transport/shmring"
	_ "github.com/kernrpc/kernrpc/plugins/transport/tcplv"
)
