package main

import (
	"runtime"
	"slices"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/plugins/transport/shmring"
)

// kernrpc over the shm-ring transport: kernrpc.go's echo service and
// client with the transport swapped, the server in its child process on
// the same host, the two attached through shared memory; the default path
// and the tuned one, as over tcp-lv. The child is given a host:port
// address with port 0, which shm-ring turns into a fresh abstract socket
// name, as TCP picks a free port. The default path runs by default on
// Linux, the only system shm-ring supports; the tuned one when named in
// -systems.

func init() {
	registerKernRPC("kernrpc-shm", "kernrpc/shm-ring", kernrpcVariant{transport: shmring.Name, codec: kernrpc.DefaultCodec})
	registerKernRPC("kernrpc-shm-tuned", "kernrpc/shm-ring tuned",
		kernrpcVariant{transport: shmring.Name, codec: kernrpc.DefaultCodec, vt: true, tuned: true})
	if runtime.GOOS == "linux" {
		i := slices.Index(defaultSystems, "kernrpc-tuned") + 1
		defaultSystems = slices.Insert(defaultSystems, i, "kernrpc-shm")
	}
}
