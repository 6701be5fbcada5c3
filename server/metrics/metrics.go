// Package metrics is what the control plane counts and how it is read
// (docs/metrics.md): events the use cases report as they happen (claims,
// lost claim races, hand-backs, outcomes, dispatch latency), and gauges read
// from the store when asked (queue depth, oldest queued age, workers by
// state). Prometheus text serves them on `lakeshore dev`'s /metrics (prom);
// CloudWatch Embedded Metric Format writes them as log lines from the
// Lambdas, so a metric costs no API call.
package metrics

import (
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// Recorder receives the control plane's events. Its methods must be safe
// for concurrent use and cheap: they run on the request path.
type Recorder interface {
	// Claimed: a poll on queue claimed n invocations, losing conflicts
	// races (wasted conditional writes); waited is how long each claimed
	// one waited since it became claimable (dispatch latency).
	Claimed(queue string, n, conflicts int, waited []time.Duration)
	// HandedBack: an attempt on queue was taken back from its worker,
	// ended as one of the domain's End* kinds (a redelivery, or the end of
	// an invocation that spent max_attempts).
	HandedBack(queue string, ended domain.EndKind)
	// Finished: an invocation of queue reached a terminal state.
	Finished(queue string, state domain.InvocationState)
}

// Discard records nothing.
type Discard struct{}

func (Discard) Claimed(string, int, int, []time.Duration) {}
func (Discard) HandedBack(string, domain.EndKind)         {}
func (Discard) Finished(string, domain.InvocationState)   {}

// Gauges is the state of the control plane at one moment.
type Gauges struct {
	Queues []QueueGauge
	// Workers counts workers by the state they read (stale computed), gone
	// ones still listed included.
	Workers map[domain.WorkerState]int
	// Runs counts runs by state (docs/runs.md).
	Runs map[domain.RunState]int
}

// QueueGauge is one queue's state.
type QueueGauge struct {
	Queue string
	// Counts by invocation state: queued is the depth.
	Counts map[domain.InvocationState]int
	// OldestQueuedAge is how long the oldest queued invocation has waited
	// (0 when none waits).
	OldestQueuedAge time.Duration
}

// Provision receives the provisioner's events (server/provision).
type Provision interface {
	// KeyHeld: a pass held back the launches of a key of queue with
	// queued work, after its hosts failed; stopped when it reached the
	// failures in a row that stop it.
	KeyHeld(queue string, stopped bool)
	// ProvisionRefused: the provisioner refused its configuration (why:
	// "launch_template") and launches nothing.
	ProvisionRefused(why string)
}

var _ Provision = (*EMF)(nil)

func (Discard) KeyHeld(string, bool)    {}
func (Discard) ProvisionRefused(string) {}
