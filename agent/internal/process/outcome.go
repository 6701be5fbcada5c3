package process

import (
	"encoding/json"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// Outcome is how one run of an invocation ended.
type Outcome struct {
	// State is succeeded, failed or cancelled. Abandoned runs (killed because
	// the daemon is shutting down) are never acked: the control plane hands
	// them out again when the daemon says bye.
	State      string
	Abandoned  bool
	ExitCode   *int
	ResultBlob json.RawMessage
	Error      *wire.ErrorInfo
	StdoutTail string
	StderrTail string
	Duration   time.Duration
}

// Ack renders an outcome as the ack of attempt of invocation for worker,
// whose daemon is in phase (its wire name): the control plane accepts a
// requeued ack only from a worker that drains.
func (o Outcome) Ack(workerID, invocationID string, attempt int, phase string) wire.AckRequest {
	return wire.AckRequest{
		Phase:        phase,
		WorkerID:     workerID,
		InvocationID: invocationID,
		Attempt:      attempt,
		State:        o.State,
		ExitCode:     o.ExitCode,
		ResultBlob:   o.ResultBlob,
		Error:        o.Error,
		StdoutTail:   o.StdoutTail,
		StderrTail:   o.StderrTail,
	}
}
