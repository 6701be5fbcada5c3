// Package control holds the control plane's use cases: what a daemon's
// hello, poll, ack and bye do, in order, over the store. The rules each step
// applies live in shared/domain (the transitions, the claim gate, the
// projection); the store loads and saves with conditional writes; shared/api
// only decodes, authenticates, calls a use case here and encodes. The same
// code runs under Lambda, under `lakeshore dev` and in tests.
package control

import (
	"context"
	"log/slog"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Store is what the use cases ask of the store.
type Store interface {
	Hello(ctx context.Context, req wire.HelloRequest, issue store.TokenIssuer) (store.HelloResult, error)
	Heartbeat(ctx context.Context, req wire.PollRequest, auth store.Authorize) (domain.Worker, error)
	RecordSetupResults(ctx context.Context, w domain.Worker, results []wire.SetupResult) (domain.Worker, error)
	SetupCommands(ctx context.Context, workerID string, pendingOnly bool) ([]domain.SetupCommand, error)
	GetWorker(ctx context.Context, id string) (domain.Worker, error)
	GetInvocation(ctx context.Context, id string) (domain.Invocation, error)
	Held(ctx context.Context, workerID string) ([]domain.Invocation, error)
	Claim(ctx context.Context, w domain.Worker, queue string, max int) (store.ClaimResult, error)
	Requeue(ctx context.Context, id, workerID, why string) (domain.Invocation, error)
	Ack(ctx context.Context, req wire.AckRequest, auth store.Authorize, tokenHash string) (wire.AckResponse, error)
	Bye(ctx context.Context, req wire.ByeRequest, auth store.Authorize) (int, error)
}

var _ Store = (*store.Store)(nil)

// Long-poll re-check backoff bounds.
const (
	pollBackoffMin = 100 * time.Millisecond
	pollBackoffMax = 2 * time.Second
)

// Service runs the daemon use cases. Build it with New.
type Service struct {
	store      Store
	staleAfter time.Duration
	maxWait    time.Duration
	sleep      func(ctx context.Context, d time.Duration) error
	log        *slog.Logger
}

// Config is what a Service needs; zero values take the defaults.
type Config struct {
	Store Store
	// StaleAfter is how long a silent worker stays live (default 60 s); a
	// long poll waits at most a third of it.
	StaleAfter time.Duration
	// MaxPollWait caps a long poll (default wire.MaxPollTimeoutS).
	MaxPollWait time.Duration
	// Sleep waits between long-poll checks (default: a timer that ends
	// early when ctx does); tests may replace it.
	Sleep  func(ctx context.Context, d time.Duration) error
	Logger *slog.Logger
}

// New returns a Service over c.Store.
func New(c Config) *Service {
	s := &Service{store: c.Store, staleAfter: c.StaleAfter, maxWait: c.MaxPollWait, sleep: c.Sleep, log: c.Logger}
	if s.staleAfter <= 0 {
		s.staleAfter = domain.DefaultStaleAfter
	}
	if s.maxWait <= 0 {
		s.maxWait = wire.MaxPollTimeoutS * time.Second
	}
	if s.sleep == nil {
		s.sleep = clock.Sleep
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// PollInterval reports the interval hello tells daemons to poll at: five
// seconds, or a sixth of the stale window when that is shorter. Six polls
// fit in every stale window, so losing a few never makes a live worker stale.
func PollInterval(staleAfter time.Duration) time.Duration {
	return min(5*time.Second, staleAfter/6)
}

// Hello registers a daemon (store.Store.Hello: idempotent per machine and
// boot; a new boot retires the old worker and hands its work back) and
// answers the stale window and poll interval it must keep; the caller adds
// the token issue minted.
func (s *Service) Hello(ctx context.Context, req wire.HelloRequest, issue store.TokenIssuer) (wire.HelloResponse, error) {
	res, err := s.store.Hello(ctx, req, issue)
	if err != nil {
		return wire.HelloResponse{}, err
	}
	s.log.Info("hello", "worker_id", res.Worker.ID, "machine_id", req.MachineID,
		"retired_worker_id", res.Retired, "requeued", res.Requeued)
	return wire.HelloResponse{
		WorkerID:      res.Worker.ID,
		StaleAfterS:   s.staleAfter.Seconds(),
		PollIntervalS: PollInterval(s.staleAfter).Seconds(),
	}, nil
}

// Ack records a worker's outcome for one attempt (domain.Invocation.Record
// decides whether it counts).
func (s *Service) Ack(ctx context.Context, req wire.AckRequest, auth store.Authorize, tokenHash string) (wire.AckResponse, error) {
	resp, err := s.store.Ack(ctx, req, auth, tokenHash)
	if err != nil {
		return resp, err
	}
	s.log.Info("ack", "worker_id", req.WorkerID, "invocation_id", req.InvocationID, "attempt", req.Attempt,
		"state", req.State, "recorded", resp.Recorded)
	return resp, nil
}

// Bye records a daemon's goodbye: its worker is gone at once and what it
// still held is handed back without waiting for the stale window.
func (s *Service) Bye(ctx context.Context, req wire.ByeRequest, auth store.Authorize) error {
	n, err := s.store.Bye(ctx, req, auth)
	if err != nil {
		return err
	}
	s.log.Info("bye", "worker_id", req.WorkerID, "reason", req.Reason,
		"inflight_abandoned", req.InflightAbandoned, "requeued", n)
	return nil
}
