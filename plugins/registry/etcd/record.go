package etcd

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kernrpc/kernrpc/kernel"
)

// record is the JSON value stored at <prefix><service>/<instance-id>. The
// service and the ID are the key's; "transport", "codec" and the other
// conventional keys travel in Metadata, as kernel.Instance has them.
type record struct {
	Address  string            `json:"address"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Load     *recordLoad       `json:"load,omitempty"`
}

type recordLoad struct {
	InFlight int64     `json:"in_flight"`
	QPS      float64   `json:"qps"`
	Updated  time.Time `json:"updated"`
}

// encodeInstance is the value of inst's key.
func encodeInstance(inst kernel.Instance) (string, error) {
	rec := record{Address: inst.Address, Metadata: inst.Metadata}
	if inst.Load != (kernel.Load{}) {
		rec.Load = &recordLoad{InFlight: inst.Load.InFlight, QPS: inst.Load.QPS, Updated: inst.Load.Updated}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return "", fmt.Errorf("%s: encode %s/%s: %w", Name, inst.Service, inst.ID, err)
	}
	return string(b), nil
}

// decodeInstance reads the value of key, under servicePrefix
// (<prefix><service>/), as an instance of service.
func decodeInstance(service, servicePrefix string, key, value []byte) (kernel.Instance, error) {
	id, ok := strings.CutPrefix(string(key), servicePrefix)
	if !ok || id == "" {
		return kernel.Instance{}, fmt.Errorf("key %q is not under %q", key, servicePrefix)
	}
	var rec record
	if err := json.Unmarshal(value, &rec); err != nil {
		return kernel.Instance{}, fmt.Errorf("key %q: %w", key, err)
	}
	if rec.Address == "" {
		return kernel.Instance{}, fmt.Errorf("key %q: no address", key)
	}
	inst := kernel.Instance{Service: service, ID: id, Address: rec.Address, Metadata: rec.Metadata}
	if rec.Load != nil {
		inst.Load = kernel.Load{InFlight: rec.Load.InFlight, QPS: rec.Load.QPS, Updated: rec.Load.Updated}
	}
	return inst, nil
}

// checkService refuses a service name the key layout cannot hold: with a
// slash in it, service "a" would read the instances of service "a/b".
func checkService(op, service string) error {
	switch {
	case service == "":
		return fmt.Errorf("%s: %s: empty service name", Name, op)
	case strings.Contains(service, "/"):
		return fmt.Errorf("%s: %s %q: a service name must not contain '/' (keys are <prefix><service>/<instance-id>)", Name, op, service)
	}
	return nil
}

// checkInstance validates what Register is given.
func checkInstance(inst kernel.Instance) error {
	if err := checkService("register", inst.Service); err != nil {
		return err
	}
	switch {
	case inst.ID == "":
		return fmt.Errorf("%s: register %s: instance has an empty ID", Name, inst.Service)
	case inst.Address == "":
		return fmt.Errorf("%s: register %s/%s: instance has an empty Address", Name, inst.Service, inst.ID)
	case !utf8.ValidString(inst.Address):
		return fmt.Errorf("%s: register %s/%s: the Address must be UTF-8 (it travels as JSON, which would mangle it)", Name, inst.Service, inst.ID)
	}
	for k, v := range inst.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("%s: register %s/%s: metadata %q: keys and values must be UTF-8 (they travel as JSON, which would mangle them)",
				Name, inst.Service, inst.ID, k)
		}
	}
	return nil
}

// cloneSet returns a copy of set whose metadata maps are copies too: every
// receiver gets a set of its own to keep, and none can change another's.
func cloneSet(set []kernel.Instance) []kernel.Instance {
	out := make([]kernel.Instance, len(set))
	for i, in := range set {
		in.Metadata = maps.Clone(in.Metadata)
		out[i] = in
	}
	return out
}

var errClosed = fmt.Errorf("%s: %w", Name, kernel.ErrClosed)

var errAbandoned = errors.New(Name + ": leases abandoned (AbandonLeases): the registry acts as if its process had died")
