package consul

import (
	"encoding/json"
	"log/slog"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

var consulMetaKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// checkConsulMeta checks meta against Consul's rules for service Meta.
func checkConsulMeta(t *testing.T, meta map[string]string) {
	t.Helper()
	if len(meta) > metaMaxPairs {
		t.Errorf("%d meta pairs; Consul takes %d", len(meta), metaMaxPairs)
	}
	for k, v := range meta {
		if !consulMetaKey.MatchString(k) || strings.HasPrefix(k, "consul-") {
			t.Errorf("meta key %q breaks Consul's rules", k)
		}
		if len(v) > metaMaxValueLen {
			t.Errorf("meta value of %q is %d bytes; Consul takes %d", k, len(v), metaMaxValueLen)
		}
		if !utf8.ValidString(v) {
			t.Errorf("meta value of %q is not UTF-8: the client's JSON would mangle it", k)
		}
	}
}

func entryOf(service string, meta map[string]string) *api.ServiceEntry {
	return &api.ServiceEntry{Service: &api.AgentService{ID: "x", Service: service, Meta: meta}}
}

func TestMetadataRoundTrips(t *testing.T) {
	// A 3-byte character on every position around the 512-byte cuts.
	var straddle strings.Builder
	for straddle.Len() < 3*metaMaxValueLen {
		straddle.WriteString("a✓")
	}
	for name, md := range map[string]map[string]string{
		"none":  nil,
		"empty": {},
		"unusual": {"Mixed-Case.Key/with": "slashes", "": "empty key", "empty": "", "lines": "a\nb\r\n", "json": `{"a":[1]}`,
			"ключ": "значение", "sep": "a=1;b=2&c", "pad": "  x  "},
		"straddling cuts": {"s": straddle.String()},
	} {
		t.Run(name, func(t *testing.T) {
			in := kernel.Instance{Service: "echo", ID: "id/with spaces", Address: "unix:///tmp/s.sock", Metadata: md}
			load := kernel.Load{InFlight: 7, QPS: 12.5, Updated: time.UnixMilli(1700000000123)}
			meta, err := encodeMeta(in, load)
			if err != nil {
				t.Fatal(err)
			}
			checkConsulMeta(t, meta)
			got, err := decodeEntry("echo", entryOf("echo", meta))
			if err != nil {
				t.Fatalf("decodeEntry refused what encodeMeta wrote: %v", err)
			}
			if got.ID != in.ID || got.Address != in.Address || got.Service != "echo" || !maps.Equal(got.Metadata, in.Metadata) || got.Load != load {
				t.Errorf("round trip: got %+v; want %+v with load %+v", got, in, load)
			}
		})
	}
}

func TestMetadataLimit(t *testing.T) {
	in := kernel.Instance{Service: "echo", ID: "a", Address: "127.0.0.1:1"}
	overhead, _ := json.Marshal(document{ID: in.ID, Address: in.Address, Metadata: map[string]string{"k": ""}})
	in.Metadata = map[string]string{"k": strings.Repeat("x", MaxEncodedInstance-len(overhead))}
	meta, err := encodeMeta(in, kernel.Load{Updated: time.Now()})
	if err != nil {
		t.Fatalf("metadata encoding to exactly %d bytes: %v", MaxEncodedInstance, err)
	}
	checkConsulMeta(t, meta)
	in.Metadata["k"] += "x"
	if _, err := encodeMeta(in, kernel.Load{}); err == nil || !strings.Contains(err.Error(), "31744") {
		t.Errorf("metadata one byte over: %v; want an error giving the limit", err)
	}
}

func TestForeignServicesResolveFromConsulFields(t *testing.T) {
	e := &api.ServiceEntry{
		Node:    &api.Node{Address: "10.1.1.1"},
		Service: &api.AgentService{ID: "web-1", Service: "web", Port: 8080, Meta: map[string]string{"version": "2"}},
	}
	got, err := decodeEntry("web", e)
	if err != nil || got.ID != "web-1" || got.Address != "10.1.1.1:8080" || got.Metadata["version"] != "2" {
		t.Errorf("foreign entry decoded as %+v, %v", got, err)
	}
	broken := entryOf("web", map[string]string{metaMark: "1", metaChunk + "0": `{"id":`})
	if _, err := decodeEntry("web", broken); err == nil || !strings.Contains(err.Error(), "does not decode") {
		t.Errorf("a half-written document: %v; want it refused as one that does not decode", err)
	}
}

// An entry no client could dial is left out of the set and logged once,
// when it first shows, not at every answer Consul gives.
func TestUndialableEntriesAreLoggedOnce(t *testing.T) {
	var logged strings.Builder
	c := &serviceCache{r: &Registry{log: slog.New(slog.NewTextHandler(&logged, nil))}, service: "web",
		attempted: make(chan struct{}), watchers: map[*watcher]func() bool{}}
	good := &api.ServiceEntry{Node: &api.Node{Address: "10.1.1.1"}, Service: &api.AgentService{ID: "web-1", Service: "web", Port: 8080}}
	noPort := &api.ServiceEntry{Node: &api.Node{Address: "10.1.1.2"}, Service: &api.AgentService{ID: "web-2", Service: "web"}}
	noAddr := entryOf("web", map[string]string{metaMark: "1", metaChunk + "0": `{"id":"a"}`})
	c.update([]*api.ServiceEntry{good, noPort, noAddr}, true)
	c.update([]*api.ServiceEntry{good, noPort, noAddr}, false)
	if len(c.set) != 1 || c.set[0].ID != "web-1" {
		t.Fatalf("set %+v; want web-1 alone", c.set)
	}
	out := logged.String()
	if strings.Count(out, "leaving out") != 2 || !strings.Contains(out, "consul_id=web-2") || !strings.Contains(out, "port 0, outside 1-65535") ||
		!strings.Contains(out, "no instance ID or no address") {
		t.Fatalf("log after two answers:\n%s\nwant each undialable entry once, with why", out)
	}
	c.update([]*api.ServiceEntry{good}, false)
	c.update([]*api.ServiceEntry{good, noPort}, false)
	if n := strings.Count(logged.String(), "leaving out"); n != 3 {
		t.Fatalf("an entry that left and came back was logged %d times in all; want 3", n)
	}
}

func TestServiceIDs(t *testing.T) {
	seen := map[string]string{}
	safe := regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
	for _, pair := range [][2]string{{"echo", "a/b"}, {"echo", "a_b"}, {"echo", "a?b"}, {"other", "a/b"}, {"echo", strings.Repeat("x", 500)}} {
		id := serviceID(pair[0], pair[1])
		if !safe.MatchString(id) || len(id) > 100 {
			t.Errorf("serviceID%q = %q: not a short, URL-path-safe ID", pair, id)
		}
		if prev, dup := seen[id]; dup {
			t.Errorf("serviceID%q = serviceID(%s) = %q", pair, prev, id)
		}
		seen[id] = pair[0] + "," + pair[1]
	}
}
