package consul

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// Shared entries (kernel.SharedStore). Consul's KV has no expiry of its
// own: a session can delete what it holds, but an agent invalidates a
// session only at twice its TTL, which is at least session_ttl_min (10s),
// where a shared entry lives for seconds (a breaker's opening, for
// open_duration + 1s), and one key held by one session cannot be written
// by another client's. So an entry carries its expiry: the value stored
// is a small JSON document (sharedRecord) with the writer's ID, the
// wall-clock time it expires, and the value. A watcher gives an entry as
// removed (nil) once that time passes, and then deletes it from Consul if
// nobody wrote it meanwhile (a check-and-set on its index), so that what a
// dead process left goes too. Writers' and watchers' clocks are compared,
// as the breaker already compares them: keep them in sync.

// sharedPrefix is the KV prefix of shared entries.
const sharedPrefix = "kernrpc/shared/"

// sharedRecord is the stored form of a shared entry.
type sharedRecord struct {
	Writer  string `json:"writer"`  // the registry that put it (Registry.writer)
	Expires int64  `json:"expires"` // Unix milliseconds
	Value   []byte `json:"value"`
}

// decodeShared reads a stored entry, refusing one that is not a record: a
// key another program wrote under the prefix.
func decodeShared(data []byte) (sharedRecord, error) {
	var rec sharedRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return sharedRecord{}, fmt.Errorf("not a kernrpc shared entry: %w", err)
	}
	if rec.Writer == "" || rec.Expires <= 0 || rec.Value == nil {
		return sharedRecord{}, errors.New("not a kernrpc shared entry: writer, expires or value missing")
	}
	return rec, nil
}

func (rec sharedRecord) expires() time.Time { return time.UnixMilli(rec.Expires) }

// newWriterID names a registry in the records it writes.
func newWriterID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sharedUsable refuses a shared-store operation (what, for the error) with
// ctx done or on a closed registry, and reports whether AbandonLeases was
// called.
func (r *Registry) sharedUsable(ctx context.Context, what string) (abandoned bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("consul: %s: %w", what, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, fmt.Errorf("consul: %s: %w", what, kernel.ErrClosed)
	}
	return r.abandoned, nil
}

// PutShared writes key with value for ttl (the ttl option when 0). Close
// deletes the entries this registry wrote last.
func (r *Registry) PutShared(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if key == "" {
		return errors.New("consul: put shared: empty key")
	}
	abandoned, err := r.sharedUsable(ctx, "put shared "+key)
	switch {
	case err != nil:
		return err
	case ttl < 0:
		return fmt.Errorf("consul: put shared %s: negative ttl %s", key, ttl)
	case abandoned:
		return fmt.Errorf("consul: put shared %s: the registry abandoned its leases (AbandonLeases): as a dead process's, it writes nothing", key)
	}
	if ttl == 0 {
		ttl = r.cfg.ttl
	}
	if value == nil {
		value = []byte{}
	}
	data, err := json.Marshal(sharedRecord{Writer: r.writer, Expires: time.Now().Add(ttl).UnixMilli(), Value: value})
	if err != nil {
		return fmt.Errorf("consul: put shared %s: %w", key, err)
	}
	octx, cancel := r.opContext(ctx)
	defer cancel()
	if _, err := r.client.KV().Put(&api.KVPair{Key: sharedPrefix + key, Value: data}, (&api.WriteOptions{}).WithContext(octx)); err != nil {
		return r.fail("put shared "+key, err)
	}
	r.mu.Lock()
	if r.sharedOwn != nil { // nil once Close has taken the keys
		r.sharedOwn[key] = struct{}{}
	}
	r.mu.Unlock()
	return nil
}

// DeleteShared deletes key; a missing key is no error.
func (r *Registry) DeleteShared(ctx context.Context, key string) error {
	if key == "" {
		return errors.New("consul: delete shared: empty key")
	}
	if _, err := r.sharedUsable(ctx, "delete shared "+key); err != nil {
		return err
	}
	octx, cancel := r.opContext(ctx)
	defer cancel()
	if _, err := r.client.KV().Delete(sharedPrefix+key, (&api.WriteOptions{}).WithContext(octx)); err != nil {
		return r.fail("delete shared "+key, err)
	}
	r.mu.Lock()
	delete(r.sharedOwn, key)
	r.mu.Unlock()
	return nil
}

// deleteOwnShared deletes, as Close, the entries this registry was the
// last to write; one another registry wrote since is left to it.
func (r *Registry) deleteOwnShared(keys map[string]struct{}) error {
	var errs []error
	for key := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.timeout)
		errs = append(errs, r.deleteIfMine(ctx, key))
		cancel()
	}
	return errors.Join(errs...)
}

func (r *Registry) deleteIfMine(ctx context.Context, key string) error {
	pair, _, err := r.client.KV().Get(sharedPrefix+key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return r.fail("delete shared "+key, err)
	}
	if pair == nil {
		return nil
	}
	if rec, err := decodeShared(pair.Value); err != nil || rec.Writer != r.writer {
		return nil
	}
	if _, _, err := r.client.KV().DeleteCAS(pair, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return r.fail("delete shared "+key, err)
	}
	return nil
}
