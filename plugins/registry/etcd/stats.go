package etcd

import "sync/atomic"

// Stats counts what a registry has asked of etcd since it was built, for
// operators and tests: how many writes its instances cost, and how often
// it had to start over.
type Stats struct {
	// InstanceWrites counts instance values written: one per Register, one
	// per instance at each re-registration, one per load report written.
	InstanceWrites int64
	// LeaseGrants counts leases granted for instances: the first, a longer
	// one when a Register asks for more, and one per re-registration.
	LeaseGrants int64
	// Reregistrations counts times the lease was lost, or no longer held
	// every instance (etcd wiped or restored from a backup), and every
	// instance was put again under a new one.
	Reregistrations int64
	// FullReads counts reads of a whole service: the first of each service,
	// and one each time its watch found its revision compacted, or etcd's
	// history another (etcd wiped or restored from a backup).
	FullReads int64
	// WatchResumes counts service watches that ended (not compacted) and
	// were started again from their last revision.
	WatchResumes int64
	// SharedWrites counts shared entries put (kernel.SharedStore), and
	// SharedLeaseGrants the leases granted for them: at most one a second
	// per ttl, however many entries are put.
	SharedWrites, SharedLeaseGrants int64
}

type stats struct {
	instanceWrites, leaseGrants, reregistrations, fullReads, watchResumes atomic.Int64
	sharedWrites, sharedLeaseGrants                                       atomic.Int64
}

// Stats returns the registry's counters.
func (r *Registry) Stats() Stats {
	return Stats{
		InstanceWrites:  r.stats.instanceWrites.Load(),
		LeaseGrants:     r.stats.leaseGrants.Load(),
		Reregistrations: r.stats.reregistrations.Load(),
		FullReads:       r.stats.fullReads.Load(),
		WatchResumes:    r.stats.watchResumes.Load(),

		SharedWrites:      r.stats.sharedWrites.Load(),
		SharedLeaseGrants: r.stats.sharedLeaseGrants.Load(),
	}
}
