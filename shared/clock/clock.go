// Package clock gives code a clock it can be handed: the real one in
// production, a Fake in tests that only moves when told to.
package clock

import (
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
