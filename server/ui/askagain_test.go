package ui

import (
	"errors"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
)

// TestAskAgain: a run action asks again while jobs remain, adding up what
// each call did, and stops at nothing remaining, at askAgainCalls calls,
// once askAgainFor has passed, or at an error.
func TestAskAgain(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name              string
		remaining         []int // what each call answers as remaining
		step              time.Duration
		fail              int // the call (1-based) that errs; 0: none
		calls, done, left int
		err               error
	}{
		{name: "until none remain", remaining: []int{7, 3, 0, 9}, calls: 3, done: 3, left: 0},
		{name: "bounded calls", remaining: []int{9, 9, 9, 9, 9, 9, 9, 9}, calls: askAgainCalls, done: askAgainCalls, left: 9},
		{name: "bounded time", remaining: []int{9, 9, 9, 9}, step: askAgainFor / 2, calls: 2, done: 2, left: 9},
		{name: "an error", remaining: []int{9, 9, 9}, fail: 2, calls: 2, done: 1, left: 9, err: boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			u := &UI{cfg: Config{Clock: fake.Clock()}}
			calls := 0
			done, left, err := u.askAgain(func() (int, int, error) {
				calls++
				fake.Advance(tc.step)
				if calls == tc.fail {
					return 0, 9, boom
				}
				return 1, tc.remaining[min(calls, len(tc.remaining))-1], nil
			})
			if calls != tc.calls || done != tc.done || left != tc.left || !errors.Is(err, tc.err) {
				t.Errorf("%d calls, done %d, left %d, %v; want %d, %d, %d, %v", calls, done, left, err, tc.calls, tc.done, tc.left, tc.err)
			}
		})
	}
}
