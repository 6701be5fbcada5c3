// Package clock is the module's one clock seam. Every component that reads
// the time takes a Clock, whose zero value is real time; a test hands it a
// Fake's (Fake.Clock), which only moves when told to, or runs the code in a
// testing/synctest bubble, where real time is the bubble's own.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock reads the time. The zero value reads real time.
type Clock struct{ now func() time.Time }

// Of returns a Clock that reads now (nil: real time).
func Of(now func() time.Time) Clock { return Clock{now: now} }

// Now reports the time.
func (c Clock) Now() time.Time {
	if c.now == nil {
		return time.Now()
	}
	return c.now()
}

// Since reports the time passed since t.
func (c Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

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

// Clock returns a Clock that reads c.
func (c *Fake) Clock() Clock { return Of(c.Now) }

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
