package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// hello says hello with bounded, jittered retries. Its error matches
// ErrHelloFailed, and ErrHelloRefused too when the answer was 401 or 403
// (never retried).
func (a *Agent) hello(ctx context.Context, req wire.HelloRequest) (session, error) {
	enroll := client.New(a.cfg.ControlPlane, a.cfg.EnrollToken, client.WithHTTPClient(a.cfg.HTTP))
	for attempt := 1; ; attempt++ {
		done := a.health.RequestStarted(health.RoleHello)
		res, err := enroll.Hello(ctx, req)
		done(err == nil)
		if err == nil {
			a.acker.RetryNow() // spooled acks still retrying go at once
			s, err := a.newSession(res)
			if err == nil {
				a.health.Registered(s.workerID, req.HostKey, a.cfg.Queue)
				a.log.Info("hello", "worker_id", s.workerID, "poll_interval", s.interval, "stale_after", s.staleAfter)
				a.notify.Registered(s.workerID, a.cfg.Queue)
			}
			return s, err
		}
		if !client.Retryable(err) || attempt >= a.cfg.HelloAttempts || ctx.Err() != nil {
			// 401/403: the enrollment token is wrong or revoked; the same
			// token gets the same answer however often it asks.
			refused := errors.Is(err, wire.ErrUnauthorized) || errors.Is(err, wire.ErrForbidden)
			a.log.Error("hello failed", "attempt", attempt, "refused", refused, "error", err.Error())
			if refused {
				return session{}, fmt.Errorf("%w: %w: %w", ErrHelloFailed, ErrHelloRefused, err)
			}
			return session{}, fmt.Errorf("%w: %w", ErrHelloFailed, err)
		}
		a.log.Warn("hello failed; retrying", "attempt", attempt, "error", err.Error())
		if err := clock.Sleep(ctx, jitter(helloBackoff(attempt))); err != nil {
			return session{}, fmt.Errorf("%w: %v", ErrHelloFailed, err)
		}
	}
}

func (a *Agent) newSession(res wire.HelloResponse) (session, error) {
	s := session{
		workerID:   res.WorkerID,
		token:      res.Token,
		staleAfter: time.Duration(res.StaleAfterS * float64(time.Second)),
		interval:   time.Duration(res.PollIntervalS * float64(time.Second)),
		api:        client.New(a.cfg.ControlPlane, res.Token, client.WithHTTPClient(a.cfg.HTTP)),
	}
	c := cadence.Of(s.staleAfter) // none (all zero) when the control plane sent no stale_after_s
	if a.cfg.PollInterval > 0 {
		s.interval = a.cfg.PollInterval
	}
	if s.interval <= 0 {
		s.interval = 5 * time.Second
	}
	if res.LongPollS > 0 {
		// At most the interval (one request per interval), and well inside
		// the request deadline health holds a poll to (requestTimeout).
		s.longPoll = min(time.Duration(res.LongPollS*float64(time.Second)), s.interval, requestTimeout/2)
	}
	switch err := checkWakeURL(res.WakeURL, a.cfg.Insecure); {
	case res.WakeURL == "":
	case err != nil:
		// The channel is only a hint: without it nymph polls on the
		// interval, as against a control plane that offers none.
		a.log.Warn("not using the wake channel hello offered; polling on the interval instead", "error", err.Error())
	default:
		// An idle daemon with its socket up polls only to stay live: as
		// often as a held poll would, within the heartbeat ratio.
		s.wakeURL = res.WakeURL
		s.wakeInterval = max(s.interval, time.Duration(res.WakePollIntervalS*float64(time.Second)))
		if s.staleAfter > 0 {
			s.wakeInterval = max(s.interval, min(s.wakeInterval, c.MaxGap))
		}
	}
	// The heartbeat ratio is the correctness argument: several polls must
	// fit in the stale window, or a live worker reads stale.
	if s.staleAfter > 0 && s.interval > c.MaxGap {
		return s, fmt.Errorf("poll interval %s is not several times shorter than the control plane's stale_after %s; use at most %s",
			s.interval, s.staleAfter, c.MaxGap)
	}
	return s, nil
}

// bootIDs makes boot ids; ULIDs sort by start time, which helps whoever reads
// a worker's history.
var bootIDs ids.Generator

// BootID returns a fresh random id for this daemon process: a new one each
// start, so a hello with a new boot id proves the previous process dead and
// lets the control plane hand its work out again.
func BootID() string { return bootIDs.New("boot") }
