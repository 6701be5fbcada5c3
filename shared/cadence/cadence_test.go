package cadence

import (
	"testing"
	"time"
)

// TestOf: the cadence of a stale window, named cases at the edges of each
// bound: the five-second interval, the wake interval's cap at the longest
// held poll and its floor at the interval, and no window at all.
func TestOf(t *testing.T) {
	for _, c := range []struct {
		name  string
		stale time.Duration
		want  Cadence
	}{
		{"the default window", 60 * time.Second, Cadence{Interval: 5 * time.Second, MaxGap: 20 * time.Second, WakeInterval: 20 * time.Second}},
		{"a short window: a sixth", 3 * time.Second, Cadence{Interval: 500 * time.Millisecond, MaxGap: time.Second, WakeInterval: time.Second}},
		{"six seconds", 6 * time.Second, Cadence{Interval: time.Second, MaxGap: 2 * time.Second, WakeInterval: 2 * time.Second}},
		{"the interval caps at five seconds", 120 * time.Second, Cadence{Interval: 5 * time.Second, MaxGap: 40 * time.Second, WakeInterval: 20 * time.Second}},
		{"the interval just under its cap", 29 * time.Second, Cadence{Interval: 29 * time.Second / 6, MaxGap: 29 * time.Second / 3, WakeInterval: 29 * time.Second / 3}},
		{"no window bounds nothing", 0, Cadence{}},
		{"a negative window bounds nothing", -time.Second, Cadence{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Of(c.stale)
			if got != c.want {
				t.Fatalf("Of(%v) = %+v, want %+v", c.stale, got, c.want)
			}
			// What the control plane and nymph both rely on.
			if c.stale > 0 && (3*got.MaxGap > c.stale || got.Interval > got.MaxGap || got.WakeInterval < got.Interval || got.WakeInterval > got.MaxGap) {
				t.Fatalf("Of(%v) = %+v breaks interval ≤ wake interval ≤ max gap ≤ stale/3", c.stale, got)
			}
		})
	}
}
