package store

import (
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// The items of the tables, one struct each, and their mapping to the
// domain's records (a plain conversion where the fields match one to one). The attribute names here are the table schema: the
// domain's types carry no storage tags, so a change to them, or to the wire
// API's JSON, cannot change what is stored by accident.

// workerRecord is the stored form of domain.Worker.
type workerRecord struct {
	ID                 string             `dynamodbav:"worker_id"`
	MachineID          string             `dynamodbav:"machine_id"`
	BootID             string             `dynamodbav:"boot_id"`
	Label              string             `dynamodbav:"label,omitempty"`
	Tags               map[string]string  `dynamodbav:"tags,omitempty"`
	Lanes              []string           `dynamodbav:"lanes,omitempty"`
	Versions           map[string]string  `dynamodbav:"versions,omitempty"`
	HostKey            string             `dynamodbav:"host_key,omitempty"`
	MaxConcurrency     int                `dynamodbav:"max_concurrency"`
	CurrentInvocations int                `dynamodbav:"current_invocations"`
	State              domain.WorkerState `dynamodbav:"state"`
	Phase              domain.Phase       `dynamodbav:"phase,omitempty"`
	HostStatus         domain.HostStatus  `dynamodbav:"host_status,omitempty"`
	TokenHash          string             `dynamodbav:"token_hash"`
	GoneWhy            string             `dynamodbav:"bye_reason,omitempty"`
	GoneKind           domain.EndKind     `dynamodbav:"gone_kind,omitempty"`
	LastSetupResult    *setupResultRecord `dynamodbav:"last_setup_result,omitempty"`
	CreatedAt          time.Time          `dynamodbav:"created_at"`
	LastSeenAt         time.Time          `dynamodbav:"last_seen_at"`
	GoneAt             time.Time          `dynamodbav:"gone_at,omitempty"`
	ReplacedBy         string             `dynamodbav:"replaced_by,omitempty"`
	MachineConflict    bool               `dynamodbav:"machine_conflict,omitempty"`
	Reaped             bool               `dynamodbav:"reaped,omitempty"`
	AdoptHostSetup     bool               `dynamodbav:"adopt_host_setup,omitempty"`
	Adoption           *adoptionRecord    `dynamodbav:"adoption,omitempty"`
	Listed             []string           `dynamodbav:"listed,omitempty"`
	// SetupAdded is absent on rows stored before it was counted (nil:
	// domain.Worker.SetupAdded < 0); AddSetup's transaction adds to it.
	SetupAdded *int  `dynamodbav:"setup_added,omitempty"`
	Version    int64 `dynamodbav:"version"`
}

// adoptionRecord is the stored form of domain.Adoption.
type adoptionRecord struct {
	HostKey   string    `dynamodbav:"host_key"`
	Queue     string    `dynamodbav:"queue"`
	HostSetup []string  `dynamodbav:"host_setup"`
	AskedAt   time.Time `dynamodbav:"asked_at"`
	Failed    string    `dynamodbav:"failed,omitempty"`
}

// hostRecord is the stored form of domain.Host.
type hostRecord struct {
	ID         string             `dynamodbav:"host_id"`
	Queue      string             `dynamodbav:"queue"`
	HostKey    string             `dynamodbav:"host_key,omitempty"`
	HostSetup  []string           `dynamodbav:"host_setup,omitempty"`
	State      domain.LaunchState `dynamodbav:"state"`
	InstanceID string             `dynamodbav:"instance_id,omitempty"`
	Market     string             `dynamodbav:"market,omitempty"`
	Reason     string             `dynamodbav:"reason,omitempty"`
	CreatedAt  time.Time          `dynamodbav:"created_at"`
	LaunchedAt time.Time          `dynamodbav:"launched_at,omitempty"`
	EndedAt    time.Time          `dynamodbav:"ended_at,omitempty"`
	Failure    string             `dynamodbav:"failure,omitempty"`
	// ExpiresAt (Unix seconds, the table's TTL) is HostRetention after an
	// ended host's end; a host alive never expires.
	ExpiresAt int64 `dynamodbav:"expires_at,omitempty"`
	Version   int64 `dynamodbav:"version"`
}

func toHostRecord(h domain.Host) hostRecord {
	var expires int64
	if !h.Alive() && !h.EndedAt.IsZero() {
		expires = h.EndedAt.Add(HostRetention).Unix()
	}
	return hostRecord{ExpiresAt: expires, ID: h.ID, Queue: h.Key.Queue, HostKey: h.Key.HostKey, HostSetup: h.HostSetup, State: h.State,
		InstanceID: h.InstanceID, Market: h.Market, Reason: h.Reason, CreatedAt: h.CreatedAt,
		LaunchedAt: h.LaunchedAt, EndedAt: h.EndedAt, Failure: h.Failure, Version: h.Version}
}

func (r hostRecord) domain() domain.Host {
	return domain.Host{ID: r.ID, Key: domain.ProvisionKey{Queue: r.Queue, HostKey: r.HostKey}, HostSetup: r.HostSetup,
		State: r.State, InstanceID: r.InstanceID, Market: r.Market, Reason: r.Reason, CreatedAt: r.CreatedAt,
		LaunchedAt: r.LaunchedAt, EndedAt: r.EndedAt, Failure: r.Failure, Version: r.Version}
}

// attemptRecord is the stored form of domain.Attempt.
type attemptRecord struct {
	Attempt   int       `dynamodbav:"attempt"`
	WorkerID  string    `dynamodbav:"worker_id"`
	ClaimedAt time.Time `dynamodbav:"claimed_at"`
	EndedAt   time.Time `dynamodbav:"ended_at,omitempty"`
	Outcome   string    `dynamodbav:"outcome,omitempty"`
	ExitCode  *int      `dynamodbav:"exit_code,omitempty"`
	Reason    string    `dynamodbav:"reason,omitempty"`
	Recorded  bool      `dynamodbav:"recorded,omitempty"`
	Retried   bool      `dynamodbav:"retried,omitempty"`
	// Artifacts: one record per name (docs/artifacts.md).
	Artifacts []artifactRecord `dynamodbav:"artifacts,omitempty"`
}

// artifactRecord is the stored form of domain.Artifact.
type artifactRecord struct {
	Name        string    `dynamodbav:"name"`
	Size        int64     `dynamodbav:"size"`
	SHA256      string    `dynamodbav:"sha256"`
	ContentType string    `dynamodbav:"content_type,omitempty"`
	CreatedAt   time.Time `dynamodbav:"created_at"`
	Pending     bool      `dynamodbav:"pending,omitempty"`
	UploadID    string    `dynamodbav:"upload_id,omitempty"`
}

// retryPolicyRecord is the stored form of domain.RetryPolicy.
type retryPolicyRecord struct {
	ExitCodes []int `dynamodbav:"exit_codes,omitempty"`
	Timeout   bool  `dynamodbav:"timeout,omitempty"`
	BackoffS  int   `dynamodbav:"backoff_s,omitempty"`
}

// invocationRecord is the stored form of domain.Invocation.
type invocationRecord struct {
	ID              string                 `dynamodbav:"invocation_id"`
	Queue           string                 `dynamodbav:"queue"`
	State           domain.InvocationState `dynamodbav:"state"`
	Attempt         int                    `dynamodbav:"attempt"`
	MaxAttempts     int                    `dynamodbav:"max_attempts"`
	Argv            []string               `dynamodbav:"argv"`
	Env             map[string]string      `dynamodbav:"env,omitempty"`
	Input           string                 `dynamodbav:"input,omitempty"`
	RunConfig       runConfigRecord        `dynamodbav:"run_config"`
	TimeoutS        int                    `dynamodbav:"timeout_s,omitempty"`
	HostKey         string                 `dynamodbav:"host_key,omitempty"`
	WorkerID        string                 `dynamodbav:"worker_id,omitempty"`
	Attempts        []attemptRecord        `dynamodbav:"attempts,omitempty"`
	Retry           *retryPolicyRecord     `dynamodbav:"retry,omitempty"`
	RetryAt         time.Time              `dynamodbav:"retry_at,omitempty"`
	ExitCode        *int                   `dynamodbav:"exit_code,omitempty"`
	ResultBlob      string                 `dynamodbav:"result_blob,omitempty"`
	Error           *errorInfoRecord       `dynamodbav:"error,omitempty"`
	StdoutTail      string                 `dynamodbav:"stdout_tail,omitempty"`
	StderrTail      string                 `dynamodbav:"stderr_tail,omitempty"`
	CancelRequested bool                   `dynamodbav:"cancel_requested,omitempty"`
	IdempotencyKey  string                 `dynamodbav:"idempotency_key,omitempty"`
	RunID           string                 `dynamodbav:"run_id,omitempty"`
	RunIndex        int                    `dynamodbav:"run_index,omitempty"`
	CreatedAt       time.Time              `dynamodbav:"created_at"`
	StartedAt       time.Time              `dynamodbav:"started_at,omitempty"`
	FinishedAt      time.Time              `dynamodbav:"finished_at,omitempty"`
	Version         int64                  `dynamodbav:"version"`
}

// setupCommandRecord is the stored form of domain.SetupCommand.
type setupCommandRecord struct {
	WorkerID   string    `dynamodbav:"worker_id"`
	CommandID  string    `dynamodbav:"command_id"`
	Argv       []string  `dynamodbav:"argv"`
	Status     string    `dynamodbav:"status"`
	ExitCode   *int      `dynamodbav:"exit_code,omitempty"`
	DurationMS int64     `dynamodbav:"duration_ms,omitempty"`
	OutputTail string    `dynamodbav:"output_tail,omitempty"`
	CreatedAt  time.Time `dynamodbav:"created_at"`
	FinishedAt time.Time `dynamodbav:"finished_at,omitempty"`
}

// setupResultRecord is the stored form of domain.SetupResult.
type setupResultRecord struct {
	CommandID  string `dynamodbav:"command_id,omitempty"`
	Command    string `dynamodbav:"command,omitempty"`
	Status     string `dynamodbav:"status"`
	ExitCode   int    `dynamodbav:"exit_code"`
	DurationMS int64  `dynamodbav:"duration_ms"`
	OutputTail string `dynamodbav:"output_tail,omitempty"`
}

// runConfigRecord is the stored form of domain.RunConfig.
type runConfigRecord struct {
	HostSetup []string          `dynamodbav:"host_setup,omitempty"`
	RunSetup  []string          `dynamodbav:"run_setup,omitempty"`
	Env       map[string]string `dynamodbav:"env,omitempty"`
	Workdir   string            `dynamodbav:"workdir,omitempty"`
	// DrainSignal and RequeueExitCodes: docs/lifecycle.md.
	DrainSignal      string `dynamodbav:"drain_signal,omitempty"`
	RequeueExitCodes []int  `dynamodbav:"requeue_exit_codes,omitempty"`
	Resident         bool   `dynamodbav:"resident,omitempty"`
}

// errorInfoRecord is the stored form of domain.ErrorInfo.
type errorInfoRecord struct {
	Type    string `dynamodbav:"type"`
	Message string `dynamodbav:"message,omitempty"`
}

func toWorkerRecord(v domain.Worker) workerRecord {
	return workerRecord{
		ID:                 v.ID,
		MachineID:          v.MachineID,
		BootID:             v.BootID,
		Label:              v.Label,
		Tags:               v.Tags,
		Lanes:              v.Lanes,
		Versions:           v.Versions,
		HostKey:            v.HostKey,
		MaxConcurrency:     v.MaxConcurrency,
		CurrentInvocations: v.CurrentInvocations,
		State:              v.State,
		Phase:              v.Phase,
		HostStatus:         v.HostStatus,
		TokenHash:          v.TokenHash,
		GoneWhy:            v.GoneWhy,
		GoneKind:           v.GoneKind,
		LastSetupResult:    ptrMap(v.LastSetupResult, toSetupResultRecord),
		CreatedAt:          v.CreatedAt,
		LastSeenAt:         v.LastSeenAt,
		GoneAt:             v.GoneAt,
		ReplacedBy:         v.ReplacedBy,
		MachineConflict:    v.MachineConflict,
		Reaped:             v.Reaped,
		AdoptHostSetup:     v.AdoptHostSetup,
		Adoption:           ptrMap(v.Adoption, func(a domain.Adoption) adoptionRecord { return adoptionRecord(a) }),
		Listed:             v.Listed,
		SetupAdded:         setupAddedRecord(v.SetupAdded),
		Version:            v.Version,
	}
}

// setupAddedRecord stores a worker's setup count, or none for a row whose
// commands were never counted (n < 0).
func setupAddedRecord(n int) *int {
	if n < 0 {
		return nil
	}
	return &n
}

func (r workerRecord) domain() domain.Worker {
	return domain.Worker{
		ID:                 r.ID,
		MachineID:          r.MachineID,
		BootID:             r.BootID,
		Label:              r.Label,
		Tags:               r.Tags,
		Lanes:              r.Lanes,
		Versions:           r.Versions,
		HostKey:            r.HostKey,
		MaxConcurrency:     r.MaxConcurrency,
		CurrentInvocations: r.CurrentInvocations,
		State:              r.State,
		Phase:              r.Phase,
		HostStatus:         r.HostStatus,
		TokenHash:          r.TokenHash,
		GoneWhy:            r.GoneWhy,
		GoneKind:           r.GoneKind,
		LastSetupResult:    ptrMap(r.LastSetupResult, setupResultRecord.domain),
		CreatedAt:          r.CreatedAt,
		LastSeenAt:         r.LastSeenAt,
		GoneAt:             r.GoneAt,
		ReplacedBy:         r.ReplacedBy,
		MachineConflict:    r.MachineConflict,
		Reaped:             r.Reaped,
		AdoptHostSetup:     r.AdoptHostSetup,
		Adoption:           ptrMap(r.Adoption, func(a adoptionRecord) domain.Adoption { return domain.Adoption(a) }),
		Listed:             r.Listed,
		SetupAdded:         derefOr(r.SetupAdded, -1),
		Version:            r.Version,
	}
}

// derefOr is *p, or or when p is nil.
func derefOr[T any](p *T, or T) T {
	if p == nil {
		return or
	}
	return *p
}

func toAttemptRecord(v domain.Attempt) attemptRecord {
	return attemptRecord{Attempt: v.Attempt, WorkerID: v.WorkerID, ClaimedAt: v.ClaimedAt, EndedAt: v.EndedAt,
		Outcome: v.Outcome, ExitCode: v.ExitCode, Reason: v.Reason, Recorded: v.Recorded, Retried: v.Retried,
		Artifacts: sliceMap(v.Artifacts, func(a domain.Artifact) artifactRecord { return artifactRecord(a) })}
}

func (r attemptRecord) domain() domain.Attempt {
	return domain.Attempt{Attempt: r.Attempt, WorkerID: r.WorkerID, ClaimedAt: r.ClaimedAt, EndedAt: r.EndedAt,
		Outcome: r.Outcome, ExitCode: r.ExitCode, Reason: r.Reason, Recorded: r.Recorded, Retried: r.Retried,
		Artifacts: sliceMap(r.Artifacts, func(a artifactRecord) domain.Artifact { return domain.Artifact(a) })}
}

func toInvocationRecord(v domain.Invocation) invocationRecord {
	return invocationRecord{
		ID:              v.ID,
		Queue:           v.Queue,
		State:           v.State,
		Attempt:         v.Attempt,
		MaxAttempts:     v.MaxAttempts,
		Argv:            v.Argv,
		Env:             v.Env,
		Input:           v.Input,
		RunConfig:       toRunConfigRecord(v.RunConfig),
		TimeoutS:        v.TimeoutS,
		HostKey:         v.HostKey,
		WorkerID:        v.WorkerID,
		Attempts:        sliceMap(v.Attempts, toAttemptRecord),
		Retry:           ptrMap(v.Retry, toRetryPolicyRecord),
		RetryAt:         v.RetryAt,
		ExitCode:        v.ExitCode,
		ResultBlob:      v.ResultBlob,
		Error:           ptrMap(v.Error, toErrorInfoRecord),
		StdoutTail:      v.StdoutTail,
		StderrTail:      v.StderrTail,
		CancelRequested: v.CancelRequested,
		IdempotencyKey:  v.IdempotencyKey,
		RunID:           v.RunID,
		RunIndex:        v.RunIndex,
		CreatedAt:       v.CreatedAt,
		StartedAt:       v.StartedAt,
		FinishedAt:      v.FinishedAt,
		Version:         v.Version,
	}
}

func (r invocationRecord) domain() domain.Invocation {
	return domain.Invocation{
		ID:              r.ID,
		Queue:           r.Queue,
		State:           r.State,
		Attempt:         r.Attempt,
		MaxAttempts:     r.MaxAttempts,
		Argv:            r.Argv,
		Env:             r.Env,
		Input:           r.Input,
		RunConfig:       r.RunConfig.domain(),
		TimeoutS:        r.TimeoutS,
		HostKey:         r.HostKey,
		WorkerID:        r.WorkerID,
		Attempts:        sliceMap(r.Attempts, attemptRecord.domain),
		Retry:           ptrMap(r.Retry, retryPolicyRecord.domain),
		RetryAt:         r.RetryAt,
		ExitCode:        r.ExitCode,
		ResultBlob:      r.ResultBlob,
		Error:           ptrMap(r.Error, errorInfoRecord.domain),
		StdoutTail:      r.StdoutTail,
		StderrTail:      r.StderrTail,
		CancelRequested: r.CancelRequested,
		IdempotencyKey:  r.IdempotencyKey,
		RunID:           r.RunID,
		RunIndex:        r.RunIndex,
		CreatedAt:       r.CreatedAt,
		StartedAt:       r.StartedAt,
		FinishedAt:      r.FinishedAt,
		Version:         r.Version,
	}
}

func toSetupCommandRecord(v domain.SetupCommand) setupCommandRecord { return setupCommandRecord(v) }

func (r setupCommandRecord) domain() domain.SetupCommand { return domain.SetupCommand(r) }

func toSetupResultRecord(v domain.SetupResult) setupResultRecord { return setupResultRecord(v) }

func (r setupResultRecord) domain() domain.SetupResult { return domain.SetupResult(r) }

func toRunConfigRecord(v domain.RunConfig) runConfigRecord { return runConfigRecord(v) }

func toRetryPolicyRecord(v domain.RetryPolicy) retryPolicyRecord { return retryPolicyRecord(v) }

func (r retryPolicyRecord) domain() domain.RetryPolicy { return domain.RetryPolicy(r) }

func (r runConfigRecord) domain() domain.RunConfig { return domain.RunConfig(r) }

func toErrorInfoRecord(v domain.ErrorInfo) errorInfoRecord { return errorInfoRecord(v) }

func (r errorInfoRecord) domain() domain.ErrorInfo { return domain.ErrorInfo(r) }

// ptrMap maps a pointer's value with f; nil stays nil.
func ptrMap[A, B any](p *A, f func(A) B) *B {
	if p == nil {
		return nil
	}
	v := f(*p)
	return &v
}

// sliceMap maps every element with f; nil stays nil.
func sliceMap[A, B any](s []A, f func(A) B) []B {
	if s == nil {
		return nil
	}
	out := make([]B, len(s))
	for i, v := range s {
		out[i] = f(v)
	}
	return out
}

// decodeInvocation reads an invocations-table item.
func decodeInvocation(item map[string]types.AttributeValue) (domain.Invocation, error) {
	var r invocationRecord
	err := unmarshal(item, &r)
	return r.domain(), err
}

// decodeWorker reads a workers-table item.
func decodeWorker(item map[string]types.AttributeValue) (domain.Worker, error) {
	var r workerRecord
	err := unmarshal(item, &r)
	return r.domain(), err
}

// decodeSetupCommand reads a commands-table item.
func decodeSetupCommand(item map[string]types.AttributeValue) (domain.SetupCommand, error) {
	var r setupCommandRecord
	err := unmarshal(item, &r)
	return r.domain(), err
}
