// Package clock gives code a clock it can be handed: the real one in
// production, a Fake in tests that only moves when told to.
package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a clock for tests: Now stays put until Advance moves it. It is safe
// for concurrent use.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now reports the clock's time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleep waits d, or until ctx ends (its error). It is the one wait the
// control plane's long poll and the agent's retries share.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
