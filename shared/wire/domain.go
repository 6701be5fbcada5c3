package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// The requests' domain forms: the HTTP edge decodes and validates a
// request, then hands the use cases (server/control) what it says in the
// domain's words. The use cases never see the wire.

// Spec is the invocation r asks for. Its RequestHash is what an
// idempotency key remembers of r ("" without a key).
func (r SubmitRequest) Spec() domain.Spec {
	spec := domain.Spec{
		Queue: r.Queue, Argv: r.Argv, Env: r.Env, RunConfig: domain.RunConfig(r.RunConfig),
		TimeoutS: r.TimeoutS, MaxAttempts: r.MaxAttempts, IdempotencyKey: r.IdempotencyKey, Input: string(r.Input),
	}
	if r.Retry != nil {
		spec.Retry = &domain.RetryPolicy{ExitCodes: r.Retry.ExitCodes, Timeout: r.Retry.Timeout, BackoffS: r.Retry.BackoffS}
	}
	if r.IdempotencyKey != "" {
		spec.RequestHash = r.hash()
	}
	return spec
}

// hash is what an idempotency key remembers of the request that first
// used it: the request as it came over the wire (maps marshal in key
// order, so it is deterministic). Keys recorded before an upgrade keep
// matching their replays only while this stays the same.
func (r SubmitRequest) hash() string {
	b, _ := json.Marshal(r)
	return hashOf(b)
}

// hashOf is the hex SHA-256 of a request's JSON.
func hashOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Registration is what hello request r says of its daemon.
func (r HelloRequest) Registration() domain.Registration {
	return domain.Registration{
		MachineID: r.MachineID, BootID: r.BootID, Label: r.Label, Tags: r.Tags, Lanes: r.Lanes,
		Versions: r.Versions, HostKey: r.HostKey, AdoptHostSetup: r.AdoptHostSetup,
		MaxConcurrency: r.Capabilities.MaxConcurrency, CurrentInvocations: r.Capabilities.CurrentInvocations,
	}
}

// Poll is what poll request r says of its daemon, and how long it may wait.
func (r PollRequest) Poll() domain.Poll {
	p := domain.Poll{WorkerID: r.WorkerID, Phase: domain.Phase(r.Phase), Queue: r.Queue, HostKey: r.HostKey, Inflight: r.Invocations,
		AdoptFailed: r.AdoptFailed, Wait: time.Duration(r.TimeoutS * float64(time.Second))}
	if c := r.UpdatedCapabilities; c != nil {
		p.Capabilities, p.MaxConcurrency, p.CurrentInvocations = true, c.MaxConcurrency, c.CurrentInvocations
	}
	for _, s := range r.SetupResults {
		p.SetupResults = append(p.SetupResults, domain.SetupResult(s))
	}
	return p
}

// Outcome is the outcome ack request r reports.
func (r AckRequest) Outcome() domain.Outcome {
	o := domain.Outcome{
		InvocationID: r.InvocationID, WorkerID: r.WorkerID, Attempt: r.Attempt, State: domain.InvocationState(r.State), ExitCode: r.ExitCode,
		Error: (*domain.ErrorInfo)(r.Error), StdoutTail: r.StdoutTail, StderrTail: r.StderrTail, Phase: domain.Phase(r.Phase),
	}
	if len(r.ResultBlob) > 0 && string(r.ResultBlob) != "null" {
		o.ResultBlob = string(r.ResultBlob)
	}
	return o
}

// QueueStatsOf is the wire form of a queue's counts.
func QueueStatsOf(st domain.QueueStats) QueueStats {
	counts := make(map[string]int, len(st.Counts))
	for state, n := range st.Counts {
		counts[string(state)] = n
	}
	return QueueStats{Queue: st.Queue, Counts: counts, DoneCount: st.DoneCount}
}

// Bye is the goodbye bye request r says.
func (r ByeRequest) Bye() domain.Bye {
	return domain.Bye{WorkerID: r.WorkerID, Reason: r.Reason, Abandoned: r.InflightAbandoned}
}

// CommandOf is command c as a poll answers it.
func CommandOf(c domain.Command) Command {
	out := Command{Type: c.Type, CommandID: c.CommandID, Argv: c.Argv, InvocationID: c.InvocationID, Reason: c.Reason,
		HostKey: c.HostKey, HostSetup: c.HostSetup}
	if inv := c.Run; inv != nil {
		out.Invocation = &RunInvocation{InvocationID: inv.ID, Attempt: inv.Attempt, Argv: inv.Argv, Env: inv.Env,
			RunConfig: RunConfig(inv.RunConfig), TimeoutS: inv.TimeoutS, HostKey: inv.HostKey}
		if inv.Input != "" {
			out.Invocation.Input = json.RawMessage(inv.Input)
		}
	}
	return out
}

// Batches is the output logs request r ships.
func (r LogsRequest) Batches() []domain.LogBatch {
	out := make([]domain.LogBatch, 0, len(r.Logs))
	for _, b := range r.Logs {
		chunks := make([]domain.LogChunk, 0, len(b.Chunks))
		for _, c := range b.Chunks {
			chunks = append(chunks, domain.LogChunk(c))
		}
		out = append(out, domain.LogBatch{InvocationID: b.InvocationID, Attempt: b.Attempt, Chunks: chunks})
	}
	return out
}

// LogPageOf is page as GET /v1/invocations/{id}/logs answers it.
func LogPageOf(page domain.LogPage) LogPage {
	out := LogPage{InvocationID: page.InvocationID, Attempt: page.Attempt, Chunks: make([]LogChunk, 0, len(page.Chunks)),
		Next: page.Next, EOF: page.EOF}
	for _, c := range page.Chunks {
		out.Chunks = append(out.Chunks, LogChunk(c))
	}
	return out
}
