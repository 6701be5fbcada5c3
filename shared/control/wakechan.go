package control

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/dreamlake/lakeshore/shared/auth"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/wake"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The wake channel (docs/dispatch.md): daemons keep a WebSocket open, and
// whoever makes work claimable tells a few of them "poll now". API Gateway
// holds the sockets on AWS, so no Lambda waits; `lakeshore dev` holds them
// itself. A wake is only a hint: the HTTP poll is what claims, so a wake
// lost, or sent to a worker that is busy by now, costs at most the poll
// interval the daemon keeps anyway.

// Poster delivers one message to one wake socket: API Gateway's management
// API on AWS (shared/wakesock), the dev server's own sockets in process.
// It answers an error that wraps ErrConnectionGone when the socket no
// longer exists.
type Poster interface {
	Post(ctx context.Context, connectionID string, msg []byte) error
}

// ErrConnectionGone is what a Poster answers for a socket that has closed.
var ErrConnectionGone = errors.New("wake connection is gone")

// Wake channel bounds.
const (
	// wakeFanout is how many sockets one claimable invocation wakes: a
	// few, not all, so woken workers do not race for one item; two, so a
	// worker that turned busy since it connected does not strand the work.
	wakeFanout = 2
	// wakeCandidates is how many of a key's sockets a wake reads to pick
	// from at random.
	wakeCandidates = 16
	// pushTimeout bounds one wake's lookup and posts; a slow management
	// API must not hold up a submit.
	pushTimeout = 2 * time.Second
	// pushPause is how long the wake channel is skipped after it failed
	// (the management API down or slow), so a hand-back of many
	// invocations does not wait pushTimeout for each.
	pushPause = 5 * time.Second
	// connectionTTL outlives API Gateway's longest connection (2 hours):
	// the items of a socket whose $disconnect never ran expire after it.
	connectionTTL = 2*time.Hour + 10*time.Minute
)

// WakePollInterval is how often an idle daemon with an open wake socket
// polls (wire.HelloResponse.WakePollIntervalS): as often as a held poll
// would, stale_after / 3 capped at the longest poll, never more often than
// PollInterval.
func WakePollInterval(staleAfter time.Duration) time.Duration {
	return max(PollInterval(staleAfter), min(staleAfter/3, wire.MaxPollTimeoutS*time.Second))
}

// wakeKeys are the keys a worker's socket listens on: the work of each
// queue it serves, for any host and for its own host key, and its own news.
func wakeKeys(w domain.Worker) []string {
	keys := []string{wake.WorkerKey(w.ID)}
	for _, q := range w.Lanes {
		keys = append(keys, wake.Key(q, ""))
		if w.HostKey != "" {
			keys = append(keys, wake.Key(q, w.HostKey))
		}
	}
	return keys
}

// Connect records wake socket connectionID for the worker whose token the
// socket presented. It refuses a token that is not a live worker's (401),
// and a gone worker (410: say hello again). The socket can only hear wakes.
func (s *Service) Connect(ctx context.Context, connectionID, token string) (domain.Worker, error) {
	id, ok := auth.WorkerOf(token)
	if !ok {
		return domain.Worker{}, wire.Errorf(wire.CodeUnauthorized, "the wake channel needs Authorization: Bearer <worker token from hello>")
	}
	w, err := s.store.GetWorker(ctx, id)
	if errors.Is(err, wire.ErrNotFound) || (err == nil && !auth.HashMatches(token, w.TokenHash)) {
		return domain.Worker{}, wire.Errorf(wire.CodeUnauthorized, "worker token is not valid (wrong secret, or revoked by a newer hello)")
	}
	if err != nil {
		return domain.Worker{}, err
	}
	if w.State == domain.WorkerGone {
		return domain.Worker{}, wire.Errorf(wire.CodeWorkerGone, "worker is gone; say hello again")
	}
	c := store.Connection{ID: connectionID, WorkerID: w.ID, Keys: wakeKeys(w), ExpiresAt: s.clock.Now().Add(connectionTTL)}
	if err := s.store.PutConnection(ctx, c); err != nil {
		return domain.Worker{}, err
	}
	s.log.Info("wake socket connected", "worker_id", w.ID, "connection_id", connectionID)
	return w, nil
}

// Disconnect forgets wake socket connectionID; an unknown one is a no-op.
func (s *Service) Disconnect(ctx context.Context, connectionID string) error {
	c, found, err := s.store.DeleteConnection(ctx, connectionID)
	if err == nil && found {
		s.log.Info("wake socket disconnected", "worker_id", c.WorkerID, "connection_id", connectionID)
	}
	return err
}

// claimable wakes a worker that may claim inv, if inv is queued: one poll
// this process holds, else a few wake sockets (notify).
func (s *Service) claimable(ctx context.Context, inv domain.Invocation) {
	if inv.State == domain.StateQueued {
		s.notify(ctx, wake.Key(inv.Queue, inv.HostKey), inv.Queue, wakeFanout)
	}
}

// workerNews ends worker id's held poll, or wakes its socket, so its next
// poll carries the news (a drain, a setup command, its retirement).
func (s *Service) workerNews(ctx context.Context, id string) {
	s.notify(ctx, wake.WorkerKey(id), "", wakeCandidates)
}

// notify wakes one waiting poll of key held in this process (the hub) and,
// if there is none, up to n of key's wake sockets, chosen at random. A
// socket found gone is forgotten and the next one tried. Failures are
// logged, never returned: the daemons' own polls are the fallback.
func (s *Service) notify(ctx context.Context, key, queue string, n int) {
	if s.wake.Wake(key, 1) > 0 || s.poster == nil {
		return
	}
	if until := s.pushPausedUntil.Load(); until != nil && s.clock.Now().Before(*until) {
		return
	}
	// The wake outlives a caller that stops waiting for its answer.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pushTimeout)
	defer cancel()
	conns, err := s.store.Connections(ctx, key, wakeCandidates)
	if err != nil {
		s.log.Warn("wake channel: list sockets", "wake_key", key, "error", err.Error())
		until := s.clock.Now().Add(pushPause)
		s.pushPausedUntil.Store(&until)
		return
	}
	rand.Shuffle(len(conns), func(i, j int) { conns[i], conns[j] = conns[j], conns[i] })
	msg, _ := json.Marshal(wire.WakeMessage{Type: wire.WakeTypeWake, Queue: queue})
	sent := 0
	for _, c := range conns {
		if sent == n {
			break
		}
		err := s.poster.Post(ctx, c.ID, msg)
		switch {
		case errors.Is(err, ErrConnectionGone):
			if err := s.Disconnect(ctx, c.ID); err != nil {
				s.log.Warn("wake channel: forget a closed socket", "connection_id", c.ID, "error", err.Error())
			}
		case err != nil:
			s.log.Warn("wake channel: post failed; not waking over it for a while", "connection_id", c.ID,
				"worker_id", c.WorkerID, "pause", pushPause, "error", err.Error())
			until := s.clock.Now().Add(pushPause)
			s.pushPausedUntil.Store(&until)
			return
		default:
			sent++
		}
	}
}
