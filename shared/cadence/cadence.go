// Package cadence is the poll cadence a stale window allows: how often a
// daemon polls and the longest it may go between polls. The control plane
// answers it at hello and bounds held polls by it; nymph keeps it (its
// backoff, its wake-socket interval, the check of a configured interval).
// Both link this package, so the rule is written once; it imports nothing
// of this module.
package cadence

import "time"

// MaxHold is the longest a poll is ever held waiting for work (the wire's
// timeout_s is capped at it): under API Gateway's 30 s integration limit.
const MaxHold = 20 * time.Second

// Cadence is the polling a stale window allows.
type Cadence struct {
	// Interval is hello's poll_interval_s: five seconds, or a sixth of the
	// stale window when that is shorter. Six polls fit in every stale
	// window, so losing a few never makes a live worker stale.
	Interval time.Duration
	// MaxGap is the longest a daemon may go between polls: a third of the
	// stale window, so a live worker is heard from at least three times in
	// it. No wait is longer: a held poll, a failing poll's backoff, an idle
	// daemon's wake-socket interval, a configured --poll-interval.
	MaxGap time.Duration
	// WakeInterval is hello's wake_poll_interval_s: how often an idle
	// daemon whose wake socket is up polls, as often as a held poll would
	// (MaxGap, at most the longest held poll, MaxHold), never
	// more often than Interval.
	WakeInterval time.Duration
}

// Of reports the cadence of the stale window staleAfter. A window of zero
// or less (a control plane that sent none) bounds nothing: every field is
// zero, and the daemon keeps its own interval.
func Of(staleAfter time.Duration) Cadence {
	if staleAfter <= 0 {
		return Cadence{}
	}
	c := Cadence{Interval: min(5*time.Second, staleAfter/6), MaxGap: staleAfter / 3}
	c.WakeInterval = max(c.Interval, min(c.MaxGap, MaxHold))
	return c
}
