package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kernrpc/kernrpc/kernel"
)

// maxTxnPuts is how many instances one re-registration transaction puts;
// etcd refuses transactions of more than 128 operations by default.
const maxTxnPuts = 64

// maxTxnBytes is how many bytes of keys and values one re-registration
// transaction puts, beyond its first instance: etcd refuses a request of
// more than 1.5 MiB by default (--max-request-bytes), and instances that it
// took one by one may not fit in one transaction together.
const maxTxnBytes = 1 << 20

type instanceKey struct{ service, id string }

// ownedInstance is an instance this registry registered, as it will be
// written again if the lease is lost (with its latest load).
type ownedInstance struct {
	inst kernel.Instance
	ttl  int64 // seconds
	rev  int64 // the revision of its last write

	// Load reports: when the instance's value was last written, whether a
	// report is waiting for the interval to end, and the timer that will
	// write it.
	lastWrite time.Time
	pending   bool
	flush     *time.Timer
}

// leaseKeeper holds the one lease a registry's instances live under. Its
// mutex serialises every write of those instances, so that a
// re-registration and a Register never interleave; its goroutine drains
// the KeepAlive channel and re-registers when the channel closes.
type leaseKeeper struct {
	r *Registry

	// mu is held across requests to etcd, each up to dial_timeout: a
	// caller waits for it with lockCtx, bounded by its own context.
	mu       ctxMutex
	owned    map[instanceKey]*ownedInstance
	id       clientv3.LeaseID // 0 before the first Register, and while lost
	ttl      int64            // seconds of id
	kaCh     <-chan *clientv3.LeaseKeepAliveResponse
	kaCancel context.CancelFunc
	stopped  bool // closed or abandoned: nothing is written any more

	changed  chan struct{} // tells run that kaCh was replaced
	stop     chan struct{}
	started  bool
	loopDone chan struct{}
}

func newLeaseKeeper(r *Registry) *leaseKeeper {
	return &leaseKeeper{
		r:        r,
		mu:       make(ctxMutex, 1),
		owned:    make(map[instanceKey]*ownedInstance),
		changed:  make(chan struct{}, 1),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
}

// ttlSeconds is ttl (the ttl option when 0) in whole seconds, rounded up.
func (r *Registry) ttlSeconds(ttl time.Duration) int64 {
	if ttl == 0 {
		ttl = r.opts.TTL.D()
	}
	return int64((ttl + time.Second - 1) / time.Second)
}

// Register puts inst under this registry's lease, granting the lease on
// the first Register (and a longer one when ttl asks for more than the
// current lease has; see the package doc for the rule). Registering the
// same Service and ID again replaces the instance, and its key moves to
// this registry's lease.
func (r *Registry) Register(ctx context.Context, inst kernel.Instance, ttl time.Duration) error {
	if err := r.usable(ctx, "register"); err != nil {
		return err
	}
	if err := checkInstance(inst); err != nil {
		return err
	}
	if ttl < 0 {
		return fmt.Errorf("%s: register %s/%s: negative ttl %s", Name, inst.Service, inst.ID, ttl)
	}
	inst = cloneSet([]kernel.Instance{inst})[0] // the registry keeps its own copy
	return r.keeper.register(ctx, inst, r.ttlSeconds(ttl))
}

func (k *leaseKeeper) register(ctx context.Context, inst kernel.Instance, ttl int64) error {
	what := fmt.Sprintf("register %s/%s", inst.Service, inst.ID)
	if err := k.lockCtx(ctx, what); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if k.stopped {
		return k.stoppedError(what)
	}
	key := instanceKey{inst.Service, inst.ID}
	prev := k.owned[key]
	o := &ownedInstance{inst: inst, ttl: ttl}
	k.owned[key] = o
	var err error
	if k.id == 0 || ttl > k.ttl {
		err = k.renewLocked(ctx, what)
	} else {
		err = k.putLocked(ctx, what, o)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// The lease expired and the KeepAlive channel has not said so
			// yet: do now what run would do.
			err = k.renewLocked(ctx, what)
		}
	}
	if err != nil {
		// As it was, with the load report it holds, if any.
		if prev != nil {
			k.owned[key] = prev
		} else {
			delete(k.owned, key)
		}
		return err
	}
	if prev != nil {
		stopFlush(prev) // replaced: what it held goes with it
	}
	k.startLocked()
	return nil
}

// Deregister deletes inst's key, whichever registry registered it.
// Removing an instance that is not there is not an error.
func (r *Registry) Deregister(ctx context.Context, inst kernel.Instance) error {
	if err := r.usable(ctx, "deregister"); err != nil {
		return err
	}
	if err := checkService("deregister", inst.Service); err != nil {
		return err
	}
	k := r.keeper
	what := fmt.Sprintf("deregister %s/%s", inst.Service, inst.ID)
	if err := k.lockCtx(ctx, what); err != nil {
		return err
	}
	defer k.mu.Unlock()
	err := r.request(ctx, what, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Delete(ctx, r.key(inst.Service, inst.ID))
		return err
	})
	if err != nil {
		return err
	}
	key := instanceKey{inst.Service, inst.ID}
	if o := k.owned[key]; o != nil {
		stopFlush(o)
		delete(k.owned, key)
	}
	return nil
}

// ctxMutex is a mutex whose Lock a caller can give up on (lockCtx).
type ctxMutex chan struct{}

func (m ctxMutex) Lock()   { m <- struct{}{} }
func (m ctxMutex) Unlock() { <-m }

// lockCtx locks k.mu for what, unless ctx ends first: the write holding it
// may wait on etcd far longer than the caller's deadline.
func (k *leaseKeeper) lockCtx(ctx context.Context, what string) error {
	select {
	case k.mu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %s: waiting for another write of this registry's instances: %w", Name, what, context.Cause(ctx))
	}
}

func (r *Registry) key(service, id string) string { return r.opts.Prefix + service + "/" + id }

func (k *leaseKeeper) stoppedError(what string) error {
	if k.r.isAbandoned() {
		return fmt.Errorf("%s: %w", what, errAbandoned)
	}
	return fmt.Errorf("%s: %s: %w", Name, what, kernel.ErrClosed)
}

// putLocked writes o under the current lease.
func (k *leaseKeeper) putLocked(ctx context.Context, what string, o *ownedInstance) error {
	val, err := encodeInstance(o.inst)
	if err != nil {
		return err
	}
	r := k.r
	err = r.request(ctx, what, func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Put(ctx, r.key(o.inst.Service, o.inst.ID), val, clientv3.WithLease(k.id))
		if err == nil {
			o.rev = resp.Header.Revision
		}
		return err
	})
	if err == nil {
		o.lastWrite = time.Now()
		r.stats.instanceWrites.Add(1)
	}
	return err
}

// renewLocked grants a new lease (of the largest ttl owned), puts every
// owned instance under it, keeps it alive, and revokes the lease it
// replaces. On failure it leaves the keeper as it was and revokes what it
// granted.
func (k *leaseKeeper) renewLocked(ctx context.Context, what string) error {
	r := k.r
	ttl := int64(1)
	for _, o := range k.owned {
		ttl = max(ttl, o.ttl)
	}
	var id clientv3.LeaseID
	err := r.request(ctx, what+": grant lease", func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Grant(ctx, ttl)
		if err == nil {
			id = resp.ID
		}
		return err
	})
	if err != nil {
		return err
	}
	r.stats.leaseGrants.Add(1)
	if err := k.putAllLocked(ctx, what, id); err != nil {
		k.revoke(id)
		return err
	}
	cli, err := r.client()
	if err != nil {
		return fmt.Errorf("%s: %s: %w", Name, what, err)
	}
	kaCtx, kaCancel := context.WithCancel(r.ctx)
	ch, err := cli.KeepAlive(kaCtx, id)
	if err != nil {
		kaCancel()
		k.revoke(id)
		return fmt.Errorf("%s: %s: keep lease alive: %w", Name, what, err)
	}
	old := k.id
	if k.kaCancel != nil {
		k.kaCancel()
	}
	k.id, k.ttl, k.kaCh, k.kaCancel = id, ttl, ch, kaCancel
	select {
	case k.changed <- struct{}{}:
	default:
	}
	if old != 0 {
		// Its keys are all under id now; revoking it deletes nothing.
		k.revoke(old)
	}
	return nil
}

// putAllLocked puts every owned instance under lease id, maxTxnPuts and
// maxTxnBytes to a transaction (an instance larger than that alone).
func (k *leaseKeeper) putAllLocked(ctx context.Context, what string, id clientv3.LeaseID) error {
	r := k.r
	all := make([]*ownedInstance, 0, len(k.owned))
	ops := make([]clientv3.Op, 0, len(k.owned))
	for _, o := range k.owned {
		val, err := encodeInstance(o.inst)
		if err != nil {
			return err
		}
		all = append(all, o)
		ops = append(ops, clientv3.OpPut(r.key(o.inst.Service, o.inst.ID), val, clientv3.WithLease(id)))
	}
	for len(all) > 0 {
		n, size := 0, 0
		for n < len(ops) && n < maxTxnPuts {
			size += len(ops[n].KeyBytes()) + len(ops[n].ValueBytes())
			if n > 0 && size > maxTxnBytes {
				break
			}
			n++
		}
		batch, batchOps := all[:n], ops[:n]
		all, ops = all[n:], ops[n:]
		var rev int64
		err := r.request(ctx, what+": put instances", func(ctx context.Context, cli *clientv3.Client) error {
			resp, err := cli.Txn(ctx).Then(batchOps...).Commit()
			if err == nil {
				rev = resp.Header.Revision
			}
			return err
		})
		if err != nil {
			return err
		}
		now := time.Now()
		for _, o := range batch {
			o.lastWrite, o.rev = now, rev
		}
		r.stats.instanceWrites.Add(int64(len(batch)))
	}
	return nil
}

// revoke revokes lease id, best effort: an unrevoked lease expires anyway.
func (k *leaseKeeper) revoke(id clientv3.LeaseID) {
	err := k.r.request(k.r.ctx, "revoke lease", func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Revoke(ctx, id)
		return err
	})
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && !errors.Is(err, kernel.ErrClosed) {
		k.r.log.Warn("etcd: could not revoke a replaced lease; it will expire", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
	}
}

// startLocked starts run, once.
func (k *leaseKeeper) startLocked() {
	if !k.started {
		k.started = true
		go k.run()
	}
}

// run drains the KeepAlive channel of the current lease and, when it
// closes (the lease expired, or went a whole TTL unanswered), registers
// every instance again; and each time the client connects to etcd again,
// it checks that etcd's history did not go back behind its writes.
func (k *leaseKeeper) run() {
	defer close(k.loopDone)
	reconnected, _ := k.r.nextReconnect()
	for {
		k.mu.Lock()
		ch, id := k.kaCh, k.id
		k.mu.Unlock()
		select {
		case <-k.stop:
			return
		case <-k.changed:
		case _, ok := <-ch:
			if !ok {
				k.reregister(id)
			}
		case <-reconnected:
			reconnected, _ = k.r.nextReconnect()
			k.checkHistory()
		}
	}
}

// checkHistory registers every instance again, under a new lease, when
// the lease no longer holds them all: etcd was wiped, or restored from an
// older backup, while the registry ran. A lease in that backup lives on,
// kept alive as before, while the keys written after the backup are gone
// and those deleted after it are back. A new lease holds every instance
// again, and revoking the old one deletes what came back. It costs one
// request per reconnection (the lease's keys), and a Get of the keys the
// lease lacks, if it lacks any.
func (k *leaseKeeper) checkHistory() {
	r := k.r
	wait := 100 * time.Millisecond
	for {
		k.mu.Lock()
		if k.stopped || k.id == 0 || len(k.owned) == 0 {
			// Stopped, or lost (reregister writes everything again), or
			// nothing to write.
			k.mu.Unlock()
			return
		}
		why, err := k.lostKeysLocked()
		if err == nil && why == "" {
			k.mu.Unlock()
			return
		}
		if err == nil {
			r.log.Warn("etcd: "+why+" (etcd wiped, or restored from an older backup); registering the instances again under a new lease",
				"lease", fmt.Sprintf("%x", int64(k.id)), "instances", len(k.owned))
			err = k.renewLocked(r.ctx, "register again after etcd's history changed")
			if err == nil {
				r.stats.reregistrations.Add(1)
				r.log.Info("etcd: instances registered again", "instances", len(k.owned))
				k.mu.Unlock()
				return
			}
		}
		k.mu.Unlock()
		r.log.Warn("etcd: checking the lease's keys after a reconnection failed; retrying", "err", err, "in", wait)
		select {
		case <-k.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// lostKeysLocked says what is amiss, if anything, with the keys of the
// current lease: it is gone, it holds a key the registry does not own, or
// it lacks an owned key that nobody wrote since the registry did (the key
// is missing, or older than the registry's last write of it). An owned
// key that another registry wrote since is that registry's: not amiss.
func (k *leaseKeeper) lostKeysLocked() (string, error) {
	r := k.r
	var ttl *clientv3.LeaseTimeToLiveResponse
	err := r.request(r.ctx, "check the lease's keys", func(ctx context.Context, cli *clientv3.Client) error {
		var err error
		ttl, err = cli.TimeToLive(ctx, k.id, clientv3.WithAttachedKeys())
		return err
	})
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return "the lease is gone", nil
	case err != nil:
		return "", err
	case ttl.TTL <= 0:
		return "the lease is gone", nil
	}
	attached := make(map[string]bool, len(ttl.Keys))
	for _, key := range ttl.Keys {
		attached[string(key)] = true
	}
	var missing []*ownedInstance
	for _, o := range k.owned {
		key := r.key(o.inst.Service, o.inst.ID)
		if attached[key] {
			delete(attached, key)
		} else {
			missing = append(missing, o)
		}
	}
	if len(attached) > 0 {
		return "the lease holds keys this registry does not own", nil
	}
	for _, o := range missing {
		var resp *clientv3.GetResponse
		key := r.key(o.inst.Service, o.inst.ID)
		err := r.request(r.ctx, "check the lease's keys", func(ctx context.Context, cli *clientv3.Client) error {
			var err error
			resp, err = cli.Get(ctx, key, clientv3.WithKeysOnly())
			return err
		})
		if err != nil {
			return "", err
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].ModRevision < o.rev {
			return "the lease lacks instance " + o.inst.Service + "/" + o.inst.ID, nil
		}
	}
	return "", nil
}

// reregister replaces lease id, lost, with a new one holding every owned
// instance, retrying until etcd answers or the keeper stops.
func (k *leaseKeeper) reregister(id clientv3.LeaseID) {
	k.mu.Lock()
	if k.id != id || k.stopped {
		k.mu.Unlock()
		return
	}
	k.id, k.kaCh = 0, nil
	k.kaCancel()
	k.kaCancel = nil
	n := len(k.owned)
	k.mu.Unlock()
	k.r.log.Warn("etcd: lease lost; registering the instances again under a new one",
		"lease", fmt.Sprintf("%x", int64(id)), "instances", n)

	wait := 100 * time.Millisecond
	for {
		k.mu.Lock()
		if k.stopped || k.id != 0 || len(k.owned) == 0 {
			// Stopped, or a Register already did it, or nothing to do: the
			// next Register grants a lease.
			k.mu.Unlock()
			return
		}
		err := k.renewLocked(k.r.ctx, "register again after the lease was lost")
		n = len(k.owned)
		k.mu.Unlock()
		if err == nil {
			k.r.stats.reregistrations.Add(1)
			k.r.log.Info("etcd: instances registered again", "instances", n)
			// A lease the client gave up on may still live in etcd (a
			// restarted etcd extends its leases); its keys are under the
			// new one now, so revoking it deletes nothing.
			k.revoke(id)
			return
		}
		k.r.log.Warn("etcd: registering again failed; retrying", "err", err, "in", wait)
		select {
		case <-k.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// abandon stops renewing without revoking, as a dead process would.
func (k *leaseKeeper) abandon() {
	k.mu.Lock()
	k.haltLocked()
	k.mu.Unlock()
	k.waitLoop()
}

// close stops the keeper and, when revoke is set, revokes the lease: every
// instance under it goes at once.
func (k *leaseKeeper) close(revoke bool) error {
	k.mu.Lock()
	id := k.id
	k.haltLocked()
	k.mu.Unlock()
	k.waitLoop()
	if !revoke || id == 0 {
		return nil
	}
	err := k.r.request(k.r.ctx, "close: revoke lease", func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Revoke(ctx, id)
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil // expired already: its instances are gone
	}
	return err
}

func (k *leaseKeeper) haltLocked() {
	if k.stopped {
		return
	}
	k.stopped = true
	if k.kaCancel != nil {
		k.kaCancel()
		k.kaCancel = nil
	}
	for _, o := range k.owned {
		stopFlush(o)
	}
	close(k.stop)
}

func (k *leaseKeeper) waitLoop() {
	k.mu.Lock()
	started := k.started
	k.mu.Unlock()
	if started {
		<-k.loopDone
	}
}

func stopFlush(o *ownedInstance) {
	if o.flush != nil {
		o.flush.Stop()
		o.flush = nil
	}
	o.pending = false
}
