package etcd

import (
	"maps"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// FuzzDecodeInstance reads arbitrary keys and values as a watch would
// deliver them. What it accepts is an instance a client can dial (an ID
// and an address), and it reads back the same after being written again,
// so that an instance does not change as it passes through the store.
func FuzzDecodeInstance(f *testing.F) {
	const prefix = "/kernrpc/echo/"
	seed, err := encodeInstance(kernel.Instance{Service: "echo", ID: "a", Address: "127.0.0.1:9000",
		Metadata: map[string]string{"codec": "protobuf"},
		Load:     kernel.Load{InFlight: 3, QPS: 2.5, Updated: time.UnixMilli(1_800_000_000_000)}})
	if err != nil {
		f.Fatal(err)
	}
	for _, kv := range [][2]string{
		{prefix + "a", seed},
		{prefix + "a", `{"address":"x","metadata":{"k":null},"load":null}`},
		{prefix + "a", `{"address":"","metadata":{}}`},
		{prefix + "a", `{"address":"x","load":{"updated":"2026-01-01T00:00:00+05:00"}}`},
		{prefix, `{"address":"x"}`},
		{"/kernrpc/other/a", `{"address":"x"}`},
		{prefix + "a", `{"address":"\xff"}`},
		{prefix + "a", `[]`},
	} {
		f.Add([]byte(kv[0]), []byte(kv[1]))
	}
	f.Fuzz(func(t *testing.T, key, value []byte) {
		inst, err := decodeInstance("echo", prefix, key, value)
		if err != nil {
			return
		}
		if inst.Service != "echo" || inst.ID == "" || inst.Address == "" {
			t.Fatalf("accepted %q = %q as %+v: no ID or address", key, value, inst)
		}
		again, err := encodeInstance(inst)
		if err != nil {
			t.Fatalf("%+v, read from %q, does not encode: %v", inst, value, err)
		}
		back, err := decodeInstance("echo", prefix, key, []byte(again))
		if err != nil {
			t.Fatalf("%q, written back from %q, does not decode: %v", again, value, err)
		}
		if back.ID != inst.ID || back.Address != inst.Address || !maps.Equal(back.Metadata, inst.Metadata) ||
			back.Load.InFlight != inst.Load.InFlight || back.Load.QPS != inst.Load.QPS ||
			!back.Load.Updated.Equal(inst.Load.Updated) {
			t.Fatalf("%q read as %+v, written back as %q, read again as %+v", value, inst, again, back)
		}
	})
}
