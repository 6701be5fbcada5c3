package agent

import (
	"math/rand/v2"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/machineid"
	"github.com/dreamlake/lakeshore/agent/internal/process"
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

// StartBudget reports the longest nymph takes from start to READY=1 with
// the default --kill-after and hello retries against a control plane that
// never answers: killing the bodies a SIGKILLed predecessor left running,
// the spooled-ack resend, the IMDS lookup, then every hello attempt timing
// out with the longest jittered backoff between them. A service manager's
// start timeout (systemd TimeoutStartSec) must exceed it, or it kills a
// daemon that was about to give up on its own (exit 1) or succeed.
func StartBudget() time.Duration {
	total := process.SweepBudget(DefaultKillAfter) + requestTimeout + machineid.DefaultIMDSTimeout
	for attempt := 1; attempt <= DefaultHelloAttempts; attempt++ {
		total += requestTimeout
		if attempt < DefaultHelloAttempts {
			total += scaled(helloBackoff(attempt), jitterHigh)
		}
	}
	return total
}

// HelloBackoffTotal reports the least time hello's retries wait in all
// before giving up (each backoff at its shortest jitter): even against a
// control plane that refuses connections at once, a start that ends in
// exit 1 lasts at least this long. A unit's start rate limit uses it to tell
// an outage (keep restarting) from a crash loop (stop); a refused token
// exits 3 at once, which the unit does not restart at all.
func HelloBackoffTotal() time.Duration {
	var total time.Duration
	for attempt := 1; attempt < DefaultHelloAttempts; attempt++ {
		total += scaled(helloBackoff(attempt), jitterLow)
	}
	return total
}
