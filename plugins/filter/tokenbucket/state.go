package tokenbucket

import "github.com/kernrpc/kernrpc/kernel"

var _ kernel.StateReporter = (*Filter)(nil)

// The values of the bucket label besides a method's name.
const (
	bucketGlobal   = "global" // scope global's one bucket
	bucketOverflow = "_other" // scope method: the bucket of the methods past maxBuckets
)

// ReportState reports each bucket's tokens now and the calls it
// rejected, labelled bucket: "global" for scope global, else the method's
// full name ("Echo.Who"), and "_other" for the methods past the 1024th
// once there are any.
func (f *Filter) ReportState(emit func(kernel.Reading)) {
	now := f.now()
	if f.global != nil {
		f.global.report(emit, bucketGlobal, now)
		return
	}
	m := *f.perMethod.m.Load()
	for method, b := range m {
		b.report(emit, method, now)
	}
	if len(m) >= maxBuckets {
		f.perMethod.overflow.report(emit, bucketOverflow, now)
	}
}

func (b *bucket) report(emit func(kernel.Reading), name string, now int64) {
	emit(kernel.Reading{Name: "token_bucket_tokens", Help: "Tokens the bucket holds now: calls it would admit at once.",
		Kind: kernel.Gauge, Labels: []kernel.Label{{Name: "bucket", Value: name}}, Value: b.tokens(now)})
	emit(kernel.Reading{Name: "token_bucket_rejected_total", Help: "Calls the bucket rejected because it had no token for them in time.",
		Kind: kernel.Counter, Labels: []kernel.Label{{Name: "bucket", Value: name}}, Value: float64(b.rejected.Load())})
}

// tokens is how many tokens the bucket holds at now, fractions included:
// burst once tat is at or before now, fewer as tat runs ahead of now, and
// 0 while calls wait for tokens reserved ahead (mode backoff).
func (b *bucket) tokens(now int64) float64 {
	ahead := max(b.tat.Load()-now, 0)
	return max(float64(b.capacity-ahead), 0) / float64(b.interval)
}
