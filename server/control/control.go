// Package control holds the control plane's use cases: what a daemon's
// hello, poll, ack and bye do, in order, over the store. The rules each step
// applies live in shared/domain (the transitions, the claim gate, the
// projection); the store loads and saves with conditional writes; server/api
// only decodes, authenticates, calls a use case here and encodes. The same
// code runs under Lambda, under `lakeshore dev` and in tests.
package control

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Store is what the use cases ask of the store: loads, and saves that are
// each one conditional write (or one transaction) of a domain transition.
type Store interface {
	Hello(ctx context.Context, reg domain.Registration, issue store.TokenIssuer) (store.HelloResult, error)
	Heartbeat(ctx context.Context, id string, p domain.Poll, auth store.Authorize, quiet time.Duration) (domain.Worker, []string, error)
	RecordSetupResults(ctx context.Context, w domain.Worker, results []domain.SetupResult) (domain.Worker, error)
	SetupCommands(ctx context.Context, workerID string, pendingOnly bool) ([]domain.SetupCommand, error)
	AddSetup(ctx context.Context, workerID string, argv []string) (domain.SetupCommand, error)
	GetWorker(ctx context.Context, id string) (domain.Worker, error)
	EachWorker(ctx context.Context, op string, fn func(domain.Worker) error) error
	EachListedWorker(ctx context.Context, op string, fn func(domain.Worker) error) error
	MarkGone(ctx context.Context, id string, auth store.Authorize, kind domain.EndKind, why string) (domain.Worker, bool, error)
	MarkReaped(ctx context.Context, id string) error
	MarkReplaced(ctx context.Context, id, boot, why string) (bool, error)
	MarkMachineConflict(ctx context.Context, id string) (domain.Worker, error)
	RequestDrain(ctx context.Context, id string) (domain.Worker, error)
	AllowHandBack(ctx context.Context, id string, phase domain.Phase, auth store.Authorize) (domain.Worker, error)
	UpdateHostStatus(ctx context.Context, id string, status domain.HostStatus) (domain.Worker, error)
	Submit(ctx context.Context, spec domain.Spec, requestHash string) (domain.Invocation, bool, error)
	GetInvocation(ctx context.Context, id string) (domain.Invocation, error)
	KnownFinished(id string) bool
	Held(ctx context.Context, workerID string) ([]domain.Invocation, error)
	Claim(ctx context.Context, w domain.Worker, queue string, max int) (store.ClaimResult, error)
	Requeue(ctx context.Context, id, workerID string, loss domain.Loss) (domain.Invocation, bool, error)
	Ack(ctx context.Context, id string, o domain.Outcome, auth store.Authorize) (store.AckResult, error)
	ChangeArtifacts(ctx context.Context, id, workerID string, auth store.Authorize,
		change func(domain.Invocation, time.Time) (domain.Invocation, error)) (domain.Invocation, error)
	Cancel(ctx context.Context, id string) (domain.Invocation, error)
	CreateRun(ctx context.Context, spec domain.RunSpec) (domain.Run, bool, error)
	PutJobs(ctx context.Context, jobs []domain.Invocation) (int, error)
	MarkRunSubmitted(ctx context.Context, id string) (domain.Run, error)
	MarkRunCancelled(ctx context.Context, id string) (domain.Run, error)
	GetRun(ctx context.Context, id string) (domain.Run, error)
	Runs(ctx context.Context, queue string, limit int, cursor string) ([]domain.Run, string, error)
	RunningJobs(ctx context.Context, queue, id string) (int, error)
	GetInvocations(ctx context.Context, ids []string) (map[string]domain.Invocation, error)
	Rerun(ctx context.Context, id string) (domain.Invocation, bool, error)
	PutConnection(ctx context.Context, c store.Connection) error
	DeleteConnection(ctx context.Context, id string) (store.Connection, bool, error)
	Connections(ctx context.Context, wakeKey string) ([]store.Connection, error)
	ConnectionsConsistent(ctx context.Context, wakeKey string) ([]store.Connection, error)
	PutLogs(ctx context.Context, id string, attempt int, chunks []domain.LogChunk) error
	Queues(ctx context.Context) ([]string, error)
	NoteQueue(ctx context.Context, queue string) error
	ReleaseRetries(ctx context.Context) ([]domain.Invocation, error)
	QueueStats(ctx context.Context, queue string) (domain.QueueStats, error)
	OldestQueued(ctx context.Context, queue string) (time.Time, bool, error)
	Logs(ctx context.Context, id string, attempt, after, limit int) ([]domain.LogChunk, error)
	LogsTail(ctx context.Context, id string, attempt, limit int) ([]domain.LogChunk, error)
	List(ctx context.Context, q store.ListQuery) ([]domain.Invocation, string, error)
	ListWorkers(ctx context.Context, limit int, cursor string) ([]domain.Worker, string, error)
	Hosts(ctx context.Context) ([]domain.Host, error)
	Ping(ctx context.Context) error
	KeyHold(ctx context.Context, k domain.ProvisionKey) (domain.KeyHold, bool, error)
	SaveKeyHold(ctx context.Context, h *domain.KeyHold) error
}

var _ Store = (*store.Store)(nil)

// Long-poll re-check backoff bounds.
const (
	pollBackoffMin = 100 * time.Millisecond
	pollBackoffMax = 2 * time.Second
	// wokenRecheck is how often a held poll re-checks on a control plane
	// that offers long polls (LongPoll): it serves every route in one
	// process, so its own submits, hand-backs, sweeps and worker changes
	// wake the polls, and the re-check only looks for work made by another
	// process on the same tables. An idle fleet's polls are most of what a
	// large fleet asks of the store, so it looks seldom.
	wokenRecheck = 5 * time.Second
)

// Service runs the daemon use cases. Build it with New.
type Service struct {
	store      Store
	staleAfter time.Duration
	maxWait    time.Duration
	sleep      func(ctx context.Context, d time.Duration) error
	clock      clock.Clock
	wake       *wake.Hub
	longPoll   bool
	poster     Poster
	wakeURL    string
	// pushPausedUntil: the wake channel failed; notify skips it until then.
	pushPausedUntil atomic.Pointer[time.Time]
	metrics         metrics.Recorder
	submitted       func(context.Context, domain.Invocation)
	log             *slog.Logger
	randMu          sync.Mutex
	rand            *rand.Rand // nil: the global source
	retention       time.Duration
	blobs           Blobs
	artifactLimits  domain.ArtifactLimits
}

// Config is what a Service needs; zero values take the defaults.
type Config struct {
	Store Store
	// StaleAfter is how long a silent worker stays live (default 60 s); a
	// long poll waits at most a third of it.
	StaleAfter time.Duration
	// MaxPollWait caps a long poll (default cadence.MaxHold).
	MaxPollWait time.Duration
	// Sleep waits between long-poll checks (default: a timer that ends
	// early when ctx does); tests may replace it.
	Sleep func(ctx context.Context, d time.Duration) error
	// Clock is what the sweep reads staleness by (zero: real time); give
	// it the store's in tests that move one.
	Clock clock.Clock
	// Wake wakes this process's waiting long polls when work they can take
	// is submitted or handed back (nil: a hub of the Service's own). A
	// process builds one Service (its main does), so one hub serves all
	// its polls.
	Wake *wake.Hub
	// LongPoll makes hello offer long polls (long_poll_s): for a control
	// plane that serves polls from a long-lived process, where a held poll
	// costs nothing and is woken the moment work arrives (`lakeshore dev`).
	// Off on Lambda, which bills a held poll for its whole wait.
	LongPoll bool
	// WakeURL is the wake channel's WebSocket URL that hello hands out
	// (Greeting.WakeURL; "": no wake channel), and Poster what
	// posts to its sockets. Both or neither.
	WakeURL string
	Poster  Poster
	// Metrics receives the use cases' events (nil: none; docs/metrics.md).
	Metrics metrics.Recorder
	// Submitted, if set, is told of each new invocation after its submit
	// is stored, before the answer: it nudges the provisioner (a channel
	// send in `lakeshore dev`, a bounded async invoke on AWS). Keep it
	// short; it never fails the submit.
	Submitted func(context.Context, domain.Invocation)
	Logger    *slog.Logger
	// Rand picks the workers a wake goes to (nil: the global source);
	// tests seed one.
	Rand *rand.Rand
	// WorkerRetention is how long a gone worker stays in the worker list
	// after the sweep is done with it (default
	// domain.DefaultWorkerRetention; the store's, whose rows expire then).
	WorkerRetention time.Duration
	// Blobs is where artifacts' bytes go (nil: artifacts are not
	// configured, and their use cases answer ErrNoBlobs). A main sets it
	// to blobs.UseCases{Store: s} for its blob store (docs/artifacts.md).
	Blobs Blobs
	// ArtifactLimits bound what one attempt publishes (zero fields: the
	// domain defaults).
	ArtifactLimits domain.ArtifactLimits
}

// New returns a Service over c.Store.
func New(c Config) *Service {
	s := &Service{store: c.Store, staleAfter: c.StaleAfter, maxWait: c.MaxPollWait, sleep: c.Sleep, clock: c.Clock, wake: c.Wake, longPoll: c.LongPoll, poster: c.Poster, wakeURL: c.WakeURL, metrics: c.Metrics, submitted: c.Submitted, log: c.Logger, rand: c.Rand, retention: c.WorkerRetention,
		blobs: c.Blobs, artifactLimits: c.ArtifactLimits.OrDefault()}
	if s.retention <= 0 {
		s.retention = domain.DefaultWorkerRetention
	}
	if s.metrics == nil {
		s.metrics = metrics.Discard{}
	}
	if s.staleAfter <= 0 {
		s.staleAfter = domain.DefaultStaleAfter
	}
	if s.maxWait <= 0 {
		s.maxWait = cadence.MaxHold
	}
	if s.sleep == nil {
		s.sleep = clock.Sleep
	}
	if s.wake == nil {
		s.wake = &wake.Hub{}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}
