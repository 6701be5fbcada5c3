// Package waittest waits in tests for a condition that another goroutine or
// process makes true: the one polling helper of the module, so every test
// waits the same way. A limit is a guard against a hang, never what a test
// measures: make it generous, and synchronise on hooks where there are any.
//
// Only tests import it; `make check` keeps it out of every binary.
package waittest

import (
	"testing"
	"time"
)

// Polling starts at firstPoll and doubles up to maxPoll, so a condition
// that soon holds is seen soon, and one that takes seconds (an HTTP round
// trip, a scan) is not asked hundreds of times a second.
const (
	firstPoll = 5 * time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// Until polls cond until it holds, or fails t after limit, naming what it
// waited for.
func Until(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	UntilState(t, limit, what, func() (bool, string) { return cond(), "" })
}

// UntilState polls cond until it reports true, or fails t after limit,
// naming what it waited for and the state cond last described.
func UntilState(t testing.TB, limit time.Duration, what string, cond func() (ok bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	pause := firstPoll
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				t.Fatalf("%s: not within %s; last seen: %s", what, limit, state)
			}
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(pause) // polling, not synchronisation
		pause = min(2*pause, maxPoll)
	}
}
