package agent

import (
	"math/rand/v2"
	"time"
)

func ptr[T any](v T) *T { return &v }

// jitter's bounds: a wait is spread over [jitterLow·d, jitterHigh·d).
const (
	jitterLow  = 0.9
	jitterHigh = 1.1
)

// jitter spreads d by ±10% so a fleet does not poll in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (jitterLow + (jitterHigh-jitterLow)*rand.Float64()))
}

// scaled reports d times f (the jitter bounds applied to a budget).
func scaled(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

// Hello's retry schedule (Agent.hello): the wait starts at helloBackoffMin,
// doubles up to helloBackoffMax, and is jittered.
const (
	helloBackoffMin = 500 * time.Millisecond
	helloBackoffMax = 10 * time.Second
)

// helloBackoff reports hello's wait after its failed try number attempt
// (from 1), before jitter. Hello and the budgets a service manager is told
// (StartBudget, HelloBackoffTotal) read the schedule here.
func helloBackoff(attempt int) time.Duration {
	d := helloBackoffMin
	for range attempt - 1 {
		d = min(d*2, helloBackoffMax)
	}
	return d
}
