package consul

import (
	"maps"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// FuzzDecodeEntry reads arbitrary health entries: kernrpc's (the mark,
// the document cut into chunks every cut bytes, the load) and foreign ones
// (Consul's own address, port and node). What it accepts is an instance a
// client can dial, and one of kernrpc's reads back the same after being
// written again, so that an instance does not change as it passes
// through Consul.
func FuzzDecodeEntry(f *testing.F) {
	meta, err := encodeMeta(kernel.Instance{ID: "a", Address: "127.0.0.1:9000", Metadata: map[string]string{"codec": "protobuf"}},
		kernel.Load{InFlight: 3, QPS: 2.5, Updated: time.UnixMilli(1_800_000_000_000)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(true, meta[metaChunk+"0"], uint16(7), meta[metaLoad], "", 0, "")
	f.Add(true, `{"id":"a"}`, uint16(0), "", "", 0, "")
	f.Add(true, `{"id":"a","addr":"x","md":{"k":null}}`, uint16(3), `{"updated_unix_ms":0}`, "", 0, "")
	f.Add(true, `{"id":`, uint16(0), `[]`, "", 0, "")
	f.Add(false, "", uint16(0), "", "10.0.0.1", 8080, "")
	f.Add(false, "", uint16(0), "", "", 8080, "10.1.1.1")
	f.Add(false, "", uint16(0), "", "", 0, "")
	f.Add(false, "", uint16(0), "", "::1", -1, "")
	f.Fuzz(func(t *testing.T, ours bool, doc string, cut uint16, load, addr string, port int, nodeAddr string) {
		meta := map[string]string{"version": "2"}
		if load != "" {
			meta[metaLoad] = load
		}
		if ours {
			meta[metaMark] = "1"
			for i, rest := 0, doc; rest != "" && i < 2*metaChunks; i++ {
				n := len(rest)
				if cut > 0 {
					n = min(n, int(cut))
				}
				meta[metaChunk+strconv.Itoa(i)] = rest[:n]
				rest = rest[n:]
			}
		}
		e := &api.ServiceEntry{Node: &api.Node{Address: nodeAddr}, Service: &api.AgentService{ID: "svc-1", Service: "echo", Address: addr, Port: port, Meta: meta}}
		in, err := decodeEntry("echo", e)
		if err != nil {
			return
		}
		if in.Service != "echo" || in.ID == "" || in.Address == "" {
			t.Fatalf("accepted %+v as %+v: no ID or address", e.Service, in)
		}
		if !ours {
			host, p, err := net.SplitHostPort(in.Address)
			if n, _ := strconv.Atoi(p); err != nil || host == "" || n < 1 || n > 65535 {
				t.Fatalf("foreign entry (address %q, port %d, node %q) read as address %q, which no client can dial", addr, port, nodeAddr, in.Address)
			}
			return
		}
		again, err := encodeMeta(in, in.Load)
		if err != nil {
			if len(doc) > MaxEncodedInstance {
				return // read from more chunks than a registration writes
			}
			t.Fatalf("%+v, read from %q, does not encode: %v", in, doc, err)
		}
		back, err := decodeEntry("echo", &api.ServiceEntry{Service: &api.AgentService{ID: "svc-1", Service: "echo", Meta: again}})
		if err != nil || back.ID != in.ID || back.Address != in.Address || !maps.Equal(back.Metadata, in.Metadata) ||
			back.Load.InFlight != in.Load.InFlight || back.Load.QPS != in.Load.QPS || !back.Load.Updated.Equal(in.Load.Updated) {
			t.Fatalf("%q read as %+v, written back as %q, read again as %+v (%v)", doc, in, again, back, err)
		}
	})
}
