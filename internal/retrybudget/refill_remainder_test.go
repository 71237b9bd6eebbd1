package retrybudget

import (
	"testing"
	"time"
)

// Reads of the budget at steps that are not whole thousandths of a token
// must not lose the remainder of each step: 1000 steps of 750µs at 2
// tokens a second are 0.75s, 1.5 tokens.
func TestRefillKeepsTheRemainderOfEachStep(t *testing.T) {
	b, c := newBudget(t, Options{Tokens: 10, Refund: 0, RefillPerSecond: 2})
	for range 10 {
		b.Failed()
	}
	for range 1000 {
		c.advance(750 * time.Microsecond)
		b.Tokens()
	}
	if got := b.Tokens(); got != 1.5 {
		t.Errorf("tokens = %v after 0.75s at 2/s read every 750µs, want 1.5", got)
	}
}
