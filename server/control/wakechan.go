package control

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// The wake channel (docs/dispatch.md): daemons keep a WebSocket open, and
// whoever makes work claimable tells a few of them "poll now". API Gateway
// holds the sockets on AWS, so no Lambda waits; `lakeshore dev` holds them
// itself. A wake is only a hint: the HTTP poll is what claims, so a wake
// lost, or sent to a worker that is busy by now, costs at most the poll
// interval the daemon keeps anyway.

// Poster tells one wake socket that work for queue arrived ("": news of
// its own worker), and closes one: API Gateway's management API on AWS
// (server/wake/wakelambda), the dev server's own sockets in process
// (server/wake/wakesock). Each encodes the message as the wire says. Both
// answer an error that wraps ErrConnectionGone when the socket no longer
// exists.
type Poster interface {
	Wake(ctx context.Context, connectionID, queue string) error
	CloseConnection(ctx context.Context, connectionID string) error
}

// ErrConnectionGone is what a Poster answers for a socket that has closed.
var ErrConnectionGone = errors.New("wake connection is gone")

// Wake channel bounds.
const (
	// wakeFanout is how many workers one claimable invocation wakes: a
	// few, not all, so woken workers do not race for one item; two, so a
	// worker that turned busy since it connected does not strand the work.
	// They are chosen among the workers, not the sockets, so a worker
	// that opens many sockets is not woken more often than one with one.
	wakeFanout = 2
	// maxWorkerSockets caps the sockets one worker keeps: nymph holds one
	// (two for a moment while it reconnects); a newer socket replaces the
	// oldest, so a worker token cannot fill the table or the wake's reads.
	maxWorkerSockets = 4
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
// a caller other than the worker's instance in IAM mode (403; instance is
// the caller's, "" in token mode) and a gone worker (410: say hello
// again). The socket can only hear wakes.
func (s *Service) Connect(ctx context.Context, connectionID, token, instance string) (domain.Worker, error) {
	id, ok := auth.WorkerOf(token)
	if !ok {
		return domain.Worker{}, domain.Errorf(domain.KindUnauthorized, "the wake channel needs Authorization: Bearer <worker token from hello>")
	}
	w, err := s.store.GetWorker(ctx, id)
	if errors.Is(err, domain.ErrNotFound) {
		// An unknown id costs the same hash and compare and gets the same
		// answer as a wrong secret: the channel tells no one which workers exist.
		return domain.Worker{}, store.UnknownWorker(id, func(w domain.Worker) error {
			auth.HashMatches(token, w.TokenHash)
			return nil
		})
	}
	if err != nil {
		return domain.Worker{}, err
	}
	if !auth.HashMatches(token, w.TokenHash) {
		return domain.Worker{}, store.ErrWorkerToken
	}
	if !auth.SameInstance(instance, w.MachineID) {
		return domain.Worker{}, domain.Errorf(domain.KindForbidden, "IAM mode: worker %s's machine_id %q is not the calling instance %s", w.ID, w.MachineID, instance)
	}
	if domain.Retired(w) {
		return domain.Worker{}, domain.Errorf(domain.KindGone, "worker is gone; say hello again")
	}
	now := s.clock.Now()
	c := store.Connection{ID: connectionID, WorkerID: w.ID, Keys: wakeKeys(w), ConnectedAt: now, ExpiresAt: now.Add(connectionTTL)}
	if err := s.store.PutConnection(ctx, c); err != nil {
		return domain.Worker{}, err
	}
	s.log.Info("wake socket connected", "worker_id", w.ID, "connection_id", connectionID)
	if err := s.capSockets(ctx, w.ID, connectionID); err != nil {
		s.log.Warn("wake channel: cap a worker's sockets", "worker_id", w.ID, "error", err.Error())
	}
	return w, nil
}

// capSockets closes and forgets worker id's oldest sockets beyond
// maxWorkerSockets, keeping the one connecting now (connectionID) and the
// newest others. Sockets that connect at once each count the others (a
// consistent read): the last one to list them sees them all, so no more
// than the cap remain (fewer may: two may each replace the other).
func (s *Service) capSockets(ctx context.Context, id, connectionID string) error {
	conns, err := s.store.ConnectionsConsistent(ctx, wake.WorkerKey(id))
	if err != nil || len(conns) <= maxWorkerSockets {
		return err
	}
	slices.SortFunc(conns, func(a, b store.Connection) int {
		if (a.ID == connectionID) != (b.ID == connectionID) {
			return boolOrder(a.ID == connectionID)
		}
		if c := b.ConnectedAt.Compare(a.ConnectedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	for _, c := range conns[maxWorkerSockets:] {
		if err := s.Disconnect(ctx, c.ID); err != nil {
			return err
		}
		if s.poster == nil {
			continue
		}
		if err := s.poster.CloseConnection(ctx, c.ID); err != nil && !errors.Is(err, ErrConnectionGone) {
			s.log.Warn("wake channel: close a replaced socket", "worker_id", id, "connection_id", c.ID, "error", err.Error())
		}
	}
	s.log.Info("wake channel: replaced a worker's oldest sockets", "worker_id", id, "replaced", len(conns)-maxWorkerSockets, "kept", maxWorkerSockets)
	return nil
}

// boolOrder sorts true first.
func boolOrder(first bool) int {
	if first {
		return -1
	}
	return 1
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

// workerNews ends worker id's held poll, or wakes its sockets, so its next
// poll carries the news (a drain, a setup command, its retirement).
func (s *Service) workerNews(ctx context.Context, id string) {
	s.notify(ctx, wake.WorkerKey(id), "", 1)
}

// notify wakes one waiting poll of key held in this process (the hub) and,
// if there is none, up to n of the workers listening on key, chosen at
// random among all of them, each on every socket it has (at most
// maxWorkerSockets), so another socket of the same token cannot take the
// wake from the daemon's own. A socket found gone is forgotten. Failures
// are logged, never returned: the daemons' own polls are the fallback.
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
	conns, err := s.store.Connections(ctx, key)
	if err != nil {
		s.log.Warn("wake channel: list sockets", "wake_key", key, "error", err.Error())
		until := s.clock.Now().Add(pushPause)
		s.pushPausedUntil.Store(&until)
		return
	}
	sent := 0
	for _, sockets := range s.pickWorkers(conns) {
		if sent == n {
			break
		}
		woke := false
		for _, c := range sockets {
			err := s.poster.Wake(ctx, c.ID, queue)
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
				woke = true
			}
		}
		if woke {
			sent++
		}
	}
}

// pickWorkers groups conns by worker and orders the workers at random
// (each its sockets, at most maxWorkerSockets of them: a cap that a
// concurrent connect has not applied yet does not widen a wake).
func (s *Service) pickWorkers(conns []store.Connection) [][]store.Connection {
	byWorker := map[string][]store.Connection{}
	for _, c := range conns {
		byWorker[c.WorkerID] = append(byWorker[c.WorkerID], c)
	}
	// Sorted first, so a seeded Rand picks the same workers every run.
	workers := slices.Sorted(maps.Keys(byWorker))
	s.shuffle(len(workers), func(i, j int) { workers[i], workers[j] = workers[j], workers[i] })
	out := make([][]store.Connection, len(workers))
	for i, w := range workers {
		sockets := byWorker[w]
		slices.SortFunc(sockets, func(a, b store.Connection) int {
			if c := b.ConnectedAt.Compare(a.ConnectedAt); c != 0 {
				return c
			}
			return strings.Compare(b.ID, a.ID)
		})
		out[i] = sockets[:min(len(sockets), maxWorkerSockets)]
	}
	return out
}

// shuffle permutes n items with the Service's Rand, else the global source.
func (s *Service) shuffle(n int, swap func(i, j int)) {
	if s.rand == nil {
		rand.Shuffle(n, swap)
		return
	}
	s.randMu.Lock()
	defer s.randMu.Unlock()
	s.rand.Shuffle(n, swap)
}
