package consul

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// Consul's limits on service Meta (agent/structs: 64 pairs, keys up to 128
// characters of [A-Za-z0-9_-] not starting with "consul-", values up to
// 512 bytes).
const (
	metaMaxPairs    = 64
	metaMaxValueLen = 512
)

// The Meta keys this plugin writes. An instance's JSON document is cut into
// values of at most 512 bytes under metaChunk+"0", "1", ...; metaMark says
// the service is kernrpc's, metaLoad holds its last load report.
const (
	metaMark  = "kernrpc"
	metaChunk = "kernrpc-"
	metaLoad  = "kernrpc-load"
	// metaChunks is what the mark and the load leave of the 64 pairs.
	metaChunks = metaMaxPairs - 2
	// MaxEncodedInstance is the longest JSON document of an instance's ID,
	// address and metadata that fits the Meta of one Consul service.
	MaxEncodedInstance = metaChunks * metaMaxValueLen
)

// document is what the Meta chunks carry: everything of a kernel.Instance
// but its Service (the Consul service name) and its Load (metaLoad).
type document struct {
	ID       string            `json:"id"`
	Address  string            `json:"addr"`
	Metadata map[string]string `json:"md,omitempty"`
}

// loadDoc is metaLoad's value.
type loadDoc struct {
	InFlight int64   `json:"in_flight"`
	QPS      float64 `json:"qps"`
	Updated  int64   `json:"updated_unix_ms"`
}

// serviceID is the Consul service ID of an instance: its ID made safe for a
// URL path segment, shortened, then a hash of service and ID that keeps
// distinct instances distinct.
func serviceID(service, id string) string {
	h := fnv.New64a()
	h.Write([]byte(service))
	h.Write([]byte{0})
	h.Write([]byte(id))
	var b strings.Builder
	for _, c := range id {
		if b.Len() >= 64 {
			break
		}
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	return fmt.Sprintf("%s-%016x", b.String(), h.Sum64())
}

// checkID is the ID of an instance's TTL check.
func checkID(serviceID string) string { return "service:" + serviceID }

// checkService refuses a service name that cannot go into a URL path as it
// is (the Consul client puts it there unescaped).
func checkService(service string) error {
	if service == "" {
		return fmt.Errorf("empty service name")
	}
	for _, c := range service {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("service name %q: Consul service names here are made of letters, digits, '-', '_' and '.'", service)
		}
	}
	return nil
}

// encodeMeta spreads inst's document over Meta values and adds the load,
// refusing metadata that is not UTF-8 (JSON would mangle it) or too large.
func encodeMeta(inst kernel.Instance, load kernel.Load) (map[string]string, error) {
	for k, v := range inst.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("metadata %q: keys and values must be UTF-8 (they travel as JSON)", k)
		}
	}
	if !utf8.ValidString(inst.ID) || !utf8.ValidString(inst.Address) {
		return nil, fmt.Errorf("the ID and Address must be UTF-8 (they travel as JSON)")
	}
	doc, err := json.Marshal(document{ID: inst.ID, Address: inst.Address, Metadata: inst.Metadata})
	if err != nil {
		return nil, err
	}
	if len(doc) > MaxEncodedInstance {
		return nil, fmt.Errorf("ID, address and metadata encode to %d bytes of JSON, over the %d that %d Consul service meta values of %d bytes hold",
			len(doc), MaxEncodedInstance, metaChunks, metaMaxValueLen)
	}
	meta := map[string]string{metaMark: "1"}
	for i, rest := 0, string(doc); rest != ""; i++ {
		if i == metaChunks {
			// Only rune boundaries can make the chunks outgrow the bound.
			return nil, fmt.Errorf("ID, address and metadata (%d bytes of JSON) do not fit %d Consul service meta values of %d bytes once cut at character boundaries",
				len(doc), metaChunks, metaMaxValueLen)
		}
		n := min(len(rest), metaMaxValueLen)
		// Cut at a rune boundary: the Consul client sends Meta as JSON,
		// which would replace half a character with U+FFFD.
		for n < len(rest) && !utf8.RuneStart(rest[n]) {
			n--
		}
		meta[metaChunk+strconv.Itoa(i)] = rest[:n]
		rest = rest[n:]
	}
	if !load.Updated.IsZero() {
		l, err := json.Marshal(loadDoc{InFlight: load.InFlight, QPS: load.QPS, Updated: load.Updated.UnixMilli()})
		if err != nil {
			return nil, err
		}
		meta[metaLoad] = string(l)
	}
	return meta, nil
}

// decodeEntry turns a health entry into an instance. A service that
// kernrpc did not register is still served, from Consul's own fields: its
// ID, its address and port (the node's address when it has none) and its
// Meta as metadata. An entry no client could dial is no instance: the
// error says why, for the log.
func decodeEntry(service string, e *api.ServiceEntry) (kernel.Instance, error) {
	s := e.Service
	if s == nil {
		return kernel.Instance{}, errors.New("the entry has no service")
	}
	in := kernel.Instance{Service: service, Load: decodeLoad(s.Meta[metaLoad])}
	if s.Meta[metaMark] != "1" {
		addr := s.Address
		if addr == "" && e.Node != nil {
			addr = e.Node.Address
		}
		switch {
		case s.ID == "":
			return kernel.Instance{}, errors.New("a service not registered by kernrpc has no ID")
		case addr == "":
			return kernel.Instance{}, errors.New("a service not registered by kernrpc has no address, nor has its node")
		case s.Port < 1 || s.Port > 65535:
			return kernel.Instance{}, fmt.Errorf("a service not registered by kernrpc has port %d, outside 1-65535", s.Port)
		}
		in.ID, in.Address = s.ID, net.JoinHostPort(addr, strconv.Itoa(s.Port))
		if host, _, err := net.SplitHostPort(in.Address); err != nil || host != addr {
			return kernel.Instance{}, fmt.Errorf("a service not registered by kernrpc has address %q, which is not a host", addr)
		}
		in.Metadata = maps.Clone(s.Meta)
		return in, nil
	}
	var b strings.Builder
	for i := 0; ; i++ {
		chunk, ok := s.Meta[metaChunk+strconv.Itoa(i)]
		if !ok {
			break
		}
		b.WriteString(chunk)
	}
	var doc document
	switch err := json.Unmarshal([]byte(b.String()), &doc); {
	case err != nil:
		return kernel.Instance{}, fmt.Errorf("its kernrpc document (Meta %s0, %s1, ...) does not decode: %w", metaChunk, metaChunk, err)
	case doc.ID == "" || doc.Address == "":
		return kernel.Instance{}, errors.New("its kernrpc document has no instance ID or no address")
	}
	in.ID, in.Address, in.Metadata = doc.ID, doc.Address, doc.Metadata
	return in, nil
}

func decodeLoad(v string) kernel.Load {
	var l loadDoc
	if v == "" || json.Unmarshal([]byte(v), &l) != nil {
		return kernel.Load{}
	}
	return kernel.Load{InFlight: l.InFlight, QPS: l.QPS, Updated: time.UnixMilli(l.Updated)}
}

// hostPort splits a kernel address into Consul's Address and Port when it
// is host:port, so that Consul's UI and DNS show something sensible; other
// addresses (a socket path) travel only in the document.
func hostPort(addr string) (string, int) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0
	}
	return host, p
}
