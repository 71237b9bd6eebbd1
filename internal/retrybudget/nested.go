package retrybudget

import (
	"context"

	"github.com/kernrpc/kernrpc/kernel"
)

// A client's retry and hedge filters spend from one budget, and on a
// method that both serve one runs inside the other's call of next. Both
// charge the failures they see and refund the successes: the inner one's
// outcome, returned to the outer one, would be charged (or refunded) twice.
// So the outer one passes a Nested as the context of each call of next, in
// which the inner one says how it accounted for what it returned, and the
// outer one charges or refunds only what the inner one did not.

// Nested is the context a budget-keeping filter with another after it in
// the config passes to a call of next: a new one for each call, since what
// the call started may hold it after it returned.
type Nested struct {
	context.Context
	// Charged: the failure returned was charged, and Failed said Allowed.
	Charged, Allowed bool
	// Refunded: the success returned was refunded.
	Refunded bool
}

// NewNested is the context of a call of next under ctx.
func NewNested(ctx context.Context) *Nested { return &Nested{Context: ctx} }

type nestedKey struct{}

// Value answers its own key with n, others from the context it wraps.
func (n *Nested) Value(key any) any {
	if key == (nestedKey{}) {
		return n
	}
	return n.Context.Value(key)
}

// AfterFunc lets contexts derived from n (context.WithCancel) be told of
// its end as they would be of the context it wraps: through that one's
// AfterFunc, if it has one (the engine's call context does), rather than
// by a goroutine of their own.
func (n *Nested) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(n.Context, f) }

// Failed charges b for the failure the outer filter got from a call of
// next made under n, unless the inner filter did; either way it reports
// whether another attempt may follow. n nil: there was no inner filter.
func (n *Nested) Failed(b kernel.AttemptBudget) bool {
	if n != nil && n.Charged {
		return n.Allowed
	}
	return b.Failed()
}

// Succeeded refunds b for the success the outer filter got from a call
// of next made under n, unless the inner filter did.
func (n *Nested) Succeeded(b kernel.AttemptBudget) {
	if n == nil || !n.Refunded {
		b.Succeeded()
	}
}

// Outer is the Nested a filter given ctx reports to: that of the
// budget-keeping filter it runs in, if any; nil otherwise.
func Outer(ctx context.Context) *Nested {
	n, _ := ctx.Value(nestedKey{}).(*Nested)
	return n
}

// Report tells the outer filter, if any (n not nil), how the outcome the
// filter returns was accounted for: a failure charged (and what Failed
// said), or not; a success refunded.
func (n *Nested) Report(charged, allowed, refunded bool) {
	if n != nil {
		n.Charged, n.Allowed, n.Refunded = charged, allowed, refunded
	}
}

// Said is what the inner filter reported in n of a failure: whether it
// charged it, and what Failed said then; nil n: nothing was charged.
func (n *Nested) Said() (charged, allowed bool) {
	if n == nil {
		return false, false
	}
	return n.Charged, n.Allowed
}

// Pass tells the outer filter, if any (out not nil), what the inner one
// reported in n (nil: nothing was charged or refunded), for an outcome
// the filter between them returns as it got it, accounting for nothing.
func (n *Nested) Pass(out *Nested) {
	if n == nil {
		out.Report(false, false, false)
		return
	}
	out.Report(n.Charged, n.Allowed, n.Refunded)
}

// Around reports whether, among refs, client filters keeping a budget
// come before self (whose calls of next it may run in: self then reports
// what it accounted for) and after it (which may run in self's calls of
// next: self then passes them a Nested).
func Around(self any, refs []kernel.PluginRef) (before, after bool) {
	seen := false
	for _, r := range refs {
		if r.Kind != kernel.KindFilter || r.Side != kernel.ClientSide {
			continue
		}
		if r.Plugin == self {
			seen = true
		} else if _, ok := r.Plugin.(kernel.AttemptBudgetOwner); ok {
			before, after = before || !seen, after || seen
		}
	}
	return before, after
}
