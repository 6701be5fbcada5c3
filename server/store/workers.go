package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// machine maps a machine to the worker of its current boot. Hello writes it
// conditionally, which is what makes a retried hello land on the same worker
// and a new boot retire the old one, even when hellos race.
type machine struct {
	MachineID string `dynamodbav:"machine_id"`
	BootID    string `dynamodbav:"boot_id"`
	WorkerID  string `dynamodbav:"worker_id"`
	// RetiredWorkerID is the worker of the boot before, which the hello
	// that wrote this row retires. It is kept so a retried hello of the
	// same boot finishes that retirement when the first hello's answer, or
	// the Lambda that ran it, was lost between the two writes.
	RetiredWorkerID string `dynamodbav:"retired_worker_id,omitempty"`
	Version         int64  `dynamodbav:"version"`
}

// workerPut is the versioned put that replaces the worker row stored at
// version prev (0: none yet) with next, at version prev + 1, which it sets.
func (s *Store) workerPut(prev int64, next *domain.Worker) (*types.Put, error) {
	next.Version = prev + 1
	item, err := attributevalue.MarshalMap(toWorkerRecord(*next))
	if err != nil {
		return nil, fmt.Errorf("encode worker %s: %w", next.ID, err)
	}
	item["roster"], item["roster_until"] = str(rosterPartition), str(rosterUntil(*next, s.WorkerRetention))
	switch {
	case next.Reaped && s.WorkerRetention > 0:
		// A reaped worker expires: the sweep found it holding nothing.
		item["expires_at"] = num(next.GoneSince().Add(s.WorkerRetention).Unix())
	case next.State == domain.WorkerJoining && s.NeverPolledRetention > 0:
		// Said hello and never polled, so it holds nothing: it goes unless
		// it polls (that put has no expires_at). A hello of the same boot
		// after it went makes a new worker.
		seen := next.LastSeenAt
		if seen.Before(next.CreatedAt) {
			seen = next.CreatedAt
		}
		item["expires_at"] = num(seen.Add(s.NeverPolledRetention).Unix())
	}
	return versionedPut(s.tables.Workers, "worker_id", item, prev), nil
}

// GetWorker reads one worker row (strongly consistent).
func (s *Store) GetWorker(ctx context.Context, id string) (domain.Worker, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.tables.Workers),
		Key:            key("worker_id", id),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return domain.Worker{}, storeErr("get worker "+id, err)
	}
	if out.Item == nil {
		s.workers.forget(id)
		return domain.Worker{}, domain.Errorf(domain.KindNotFound, "worker %s not found", id)
	}
	w, err := decodeWorker(out.Item)
	if err == nil {
		s.rememberWorker(w)
	}
	return w, err
}

// rememberWorker keeps w as the latest this store knows of its row
// (RememberWrites), unless it knows a later version already.
func (s *Store) rememberWorker(w domain.Worker) {
	if s.RememberWrites {
		s.workers.putIf(w.ID, w.Clone(), func(old domain.Worker) bool { return old.Version <= w.Version })
	}
}

func (s *Store) getMachine(ctx context.Context, id string) (machine, bool, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.tables.Machines),
		Key:            key("machine_id", id),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return machine{}, false, storeErr("get machine "+id, err)
	}
	if out.Item == nil {
		return machine{}, false, nil
	}
	var m machine
	return m, true, unmarshal(out.Item, &m)
}

// HelloResult is what a hello's registration did.
type HelloResult struct {
	Worker domain.Worker
	// Retired is the worker of the machine's previous boot, which this
	// hello replaced and the caller must retire (make gone, hand its work
	// back). A retried hello of the same boot names it again, since the
	// first try's answer, or the Lambda that ran it, may have been lost
	// before the retirement was done; Again reports that case.
	Retired string
	// Again reports a retried hello of the same boot: the same worker,
	// with a new token.
	Again bool
}

// TokenIssuer mints a token for a worker id and reports the hash to store.
type TokenIssuer func(workerID string) (hash string, err error)

// Hello registers a daemon (the machines table decides, with one
// conditional write, which worker a machine's boot is). A retried hello
// from the same machine_id and boot_id returns the same worker, with a newly
// issued token replacing the old (the daemon never saw the first answer). A
// hello with a new boot_id makes a new worker and names the one it
// replaced in Retired; retiring it is the caller's next step
// (control.Service.Hello), and a hello after the worker went gone (its poll
// got 410) makes a new worker.
func (s *Store) Hello(ctx context.Context, reg domain.Registration, issue TokenIssuer) (HelloResult, error) {
	var res HelloResult
	err := retryVersion("hello "+reg.MachineID, func() error {
		res = HelloResult{}
		m, found, err := s.getMachine(ctx, reg.MachineID)
		if err != nil {
			return err
		}
		now := s.now()
		if found && m.BootID == "" {
			// A host the provisioner launched: its first hello adopts the
			// pending row written for it.
			adopted, done, err := s.adopt(ctx, m, reg, issue, now)
			if err != nil || done {
				res = HelloResult{Worker: adopted}
				return err
			}
		}
		if found && m.BootID == reg.BootID {
			w, err := s.GetWorker(ctx, m.WorkerID)
			if err == nil && !domain.Retired(w) {
				hash, err := issue(w.ID)
				if err != nil {
					return fmt.Errorf("issue token: %w", err)
				}
				next := w.Register(reg, hash, now)
				put, err := s.workerPut(w.Version, &next)
				if err != nil {
					return err
				}
				if err := s.put(ctx, put); err != nil {
					return storeErr("hello", err)
				}
				res = HelloResult{Worker: next, Retired: m.RetiredWorkerID, Again: true}
				return nil
			}
			if err != nil && !errors.Is(err, domain.ErrNotFound) {
				return err
			}
		}
		id := s.IDs.New(ids.Worker)
		hash, err := issue(id)
		if err != nil {
			return fmt.Errorf("issue token: %w", err)
		}
		w := domain.NewWorker(id, reg, hash, now)
		wput, err := s.workerPut(0, &w)
		if err != nil {
			return err
		}
		next := machine{MachineID: reg.MachineID, BootID: reg.BootID, WorkerID: w.ID, Version: m.Version + 1}
		if found {
			next.RetiredWorkerID = m.WorkerID
		}
		mitem, err := attributevalue.MarshalMap(next)
		if err != nil {
			return fmt.Errorf("encode machine: %w", err)
		}
		_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
			{Put: versionedPut(s.tables.Machines, "machine_id", mitem, m.Version)},
			{Put: wput},
		}})
		if _, cancelled := cancelledBy(err); cancelled {
			return errVersion // another hello of this machine won; look again
		}
		if err != nil {
			return storeErr("hello", err)
		}
		res = HelloResult{Worker: w, Retired: next.RetiredWorkerID}
		return nil
	})
	return res, err
}

// Authorize checks a worker row against the presented token; it is given to
// the store so the check is repeated on every re-read of a racing update.
type Authorize func(domain.Worker) error

// ErrWorkerToken answers every worker token that does not pass: one that
// names no worker, has a wrong secret, or was revoked by a newer hello. One
// answer for all, byte for byte: a daemon route never tells a bad token
// whether a worker exists. An Authorize check returns it on a wrong secret.
var ErrWorkerToken = domain.Errorf(domain.KindUnauthorized, "worker token is not valid (wrong secret, no such worker, or revoked by a newer hello)")

// UnknownWorker answers a token whose worker id names no row: auth is run
// against a row with no token hash (it cannot pass), so the answer costs
// the same hash and compare as a wrong secret, and is ErrWorkerToken.
func UnknownWorker(id string, auth Authorize) error {
	if auth != nil {
		_ = auth(domain.Worker{ID: id})
	}
	return ErrWorkerToken
}

// updateWorker reads worker id, checks it with auth, lets change compute the
// next row (a domain transition, which reports whether it changes anything),
// and puts it guarded by the version read, retrying lost races. The version
// is bumped here, never by change.
func (s *Store) updateWorker(ctx context.Context, op, id string, auth Authorize, change func(domain.Worker) (domain.Worker, bool, error)) (domain.Worker, error) {
	return s.updateWorkerFrom(ctx, op, id, auth, change, false)
}

// updateWorkerFrom is updateWorker that, when remembered is set, first tries
// the row as this store last wrote or read it (Store.workers) instead of
// reading it. That try counts only if it ends in a write, which its version
// guards: a row changed since fails the put. Anything else it would decide
// (auth refused, change refused, nothing to write) is decided again on the
// row read afresh, as is a lost put. change must therefore not count what
// a try saw across tries.
func (s *Store) updateWorkerFrom(ctx context.Context, op, id string, auth Authorize, change func(domain.Worker) (domain.Worker, bool, error), remembered bool) (domain.Worker, error) {
	var result domain.Worker
	err := retryVersion(op+" "+id, func() error {
		w, hint := domain.Worker{}, false
		if remembered {
			remembered = false
			w, hint = s.workers.get(id)
			w = w.Clone()
		}
		if !hint {
			var err error
			w, err = s.GetWorker(ctx, id)
			if auth != nil && errors.Is(err, domain.ErrNotFound) {
				return UnknownWorker(id, auth)
			}
			if err != nil {
				return err
			}
		}
		if auth != nil {
			if err := auth(w); err != nil {
				if hint {
					return errVersion
				}
				return err
			}
		}
		next, write, err := change(w)
		switch {
		case hint && (err != nil || !write):
			return errVersion
		case err != nil:
			return err
		case !write:
			result = w
			return nil
		}
		put, err := s.workerPut(w.Version, &next)
		if err != nil {
			return err
		}
		if err := s.put(ctx, put); err != nil {
			s.workers.forget(id)
			return storeErr(op+" "+id, err)
		}
		s.rememberWorker(next)
		result = next
		return nil
	})
	return result, err
}

// always adapts a transition that always writes to updateWorker's change.
func always(fn func(domain.Worker) (domain.Worker, error)) func(domain.Worker) (domain.Worker, bool, error) {
	return func(w domain.Worker) (domain.Worker, bool, error) {
		next, err := fn(w)
		return next, err == nil, err
	}
}

// noError adapts a transition that cannot fail to updateWorker's change.
func noError(fn func(domain.Worker) (domain.Worker, bool)) func(domain.Worker) (domain.Worker, bool, error) {
	return func(w domain.Worker) (domain.Worker, bool, error) {
		next, write := fn(w)
		return next, write, nil
	}
}

// Heartbeat records poll p of worker id (domain.Worker.Heartbeat):
// last_seen_at, phase, the state the phase projects to, capabilities and
// host key, and what it lists in flight. It also reports what the
// worker's poll before this one listed (domain.Invocation.Undelivered).
// A retired worker gets ErrWorkerGone (410): it must say hello again.
//
// A poll that would change nothing but last_seen_at, within quiet of the
// stored one, writes nothing: a busy fleet's workers poll every few
// seconds (woken, or after a claim), and the row's last_seen_at is then
// at most quiet behind, which the stale window allows for
// (control.Service.heartbeat).
func (s *Store) Heartbeat(ctx context.Context, id string, p domain.Poll, auth Authorize, quiet time.Duration) (domain.Worker, []string, error) {
	now := s.now()
	var prior []string
	w, err := s.updateWorkerFrom(ctx, "poll", id, auth, func(w domain.Worker) (domain.Worker, bool, error) {
		prior = w.Listed
		next, err := w.Heartbeat(p, now)
		if err != nil {
			return next, false, err
		}
		return next, !onlySeen(w, next) || now.Sub(w.LastSeenAt) >= quiet, nil
	}, s.RememberWrites)
	return w, prior, err
}

// onlySeen reports whether next differs from the stored w in nothing but
// last_seen_at, as the row stores it (an empty list is no list).
func onlySeen(w, next domain.Worker) bool {
	next.LastSeenAt = w.LastSeenAt
	if len(next.Listed) == 0 && len(w.Listed) == 0 {
		next.Listed = w.Listed
	}
	return reflect.DeepEqual(toWorkerRecord(w), toWorkerRecord(next))
}

// MarkGone makes worker id gone (if it is not already), recording why: its
// own bye when auth is its token (domain.Worker.Leave), else a retirement
// that keeps its last_seen_at (domain.Worker.Retire). It reports whether this call made it gone (false:
// it already was). It does not requeue; callers follow with control.Service.HandBack.
func (s *Store) MarkGone(ctx context.Context, id string, auth Authorize, kind domain.EndKind, why string) (domain.Worker, bool, error) {
	now := s.now()
	left := false
	w, err := s.updateWorker(ctx, "mark gone", id, auth, noError(func(w domain.Worker) (domain.Worker, bool) {
		var next domain.Worker
		var changed bool
		if kind == domain.EndBye {
			next, changed = w.Leave(why, now) // its own bye: heard from now
		} else {
			next, changed = w.Retire(kind, why, now)
		}
		// A retry after a write whose answer was lost finds the worker gone
		// already: the first try's write still counts as this call's.
		left = left || changed
		return next, changed
	}))
	return w, left, err
}

// adopt hands pending worker m.WorkerID to the hello reg (one
// transaction with the machine row, now naming the boot). done is false
// when there is no pending row to adopt (it was let go): the hello then
// makes a worker as for any machine.
func (s *Store) adopt(ctx context.Context, m machine, reg domain.Registration, issue TokenIssuer, now time.Time) (domain.Worker, bool, error) {
	w, err := s.GetWorker(ctx, m.WorkerID)
	if errors.Is(err, domain.ErrNotFound) || (err == nil && !w.Pending()) {
		return domain.Worker{}, false, nil
	}
	if err != nil {
		return domain.Worker{}, false, err
	}
	hash, err := issue(w.ID)
	if err != nil {
		return domain.Worker{}, false, fmt.Errorf("issue token: %w", err)
	}
	next := w.Adopt(reg, hash, now)
	wput, err := s.workerPut(w.Version, &next)
	if err != nil {
		return domain.Worker{}, false, err
	}
	nm := m
	nm.BootID, nm.Version = reg.BootID, m.Version+1
	mitem, err := attributevalue.MarshalMap(nm)
	if err != nil {
		return domain.Worker{}, false, fmt.Errorf("encode machine: %w", err)
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: versionedPut(s.tables.Machines, "machine_id", mitem, m.Version)},
		{Put: wput},
	}})
	if _, cancelled := cancelledBy(err); cancelled {
		return domain.Worker{}, false, errVersion // another hello won; look again
	}
	if err != nil {
		return domain.Worker{}, false, storeErr("hello (adopt)", err)
	}
	return next, true, nil
}

// PutPendingWorker records w (domain.NewPendingWorker) and its machine row,
// so the launched host's hello adopts it. A machine already known is left
// as it is (false): a host id is never reused, but an instance id might be
// met twice by a retried launch.
func (s *Store) PutPendingWorker(ctx context.Context, w domain.Worker) (bool, error) {
	wput, err := s.workerPut(0, &w)
	if err != nil {
		return false, err
	}
	mitem, err := attributevalue.MarshalMap(machine{MachineID: w.MachineID, WorkerID: w.ID, Version: 1})
	if err != nil {
		return false, fmt.Errorf("encode machine: %w", err)
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: versionedPut(s.tables.Machines, "machine_id", mitem, 0)},
		{Put: wput},
	}})
	if _, cancelled := cancelledBy(err); cancelled {
		return false, nil
	}
	if err != nil {
		return false, storeErr("put pending worker "+w.ID, err)
	}
	return true, nil
}

// MarkReplaced makes worker id gone because a hello from boot, a new boot
// of its machine, replaced it (domain.Worker.Replace), and reports whether
// this call made it gone. Its poll then answers 410 with reason replaced.
func (s *Store) MarkReplaced(ctx context.Context, id, boot, why string) (left bool, err error) {
	now := s.now()
	_, err = s.updateWorker(ctx, "mark replaced", id, nil, noError(func(w domain.Worker) (domain.Worker, bool) {
		next, changed := w.Replace(boot, why, now)
		left = left || changed
		return next, changed
	}))
	return left, err
}

// MarkMachineConflict records that replaced worker id polled again
// (domain.Worker.ReplacedAlive): two processes use its machine id.
func (s *Store) MarkMachineConflict(ctx context.Context, id string) (domain.Worker, error) {
	return s.updateWorker(ctx, "mark machine conflict", id, nil, noError(domain.Worker.ReplacedAlive))
}

// AskToAdopt asks worker id to take on adoption a's host key
// (domain.Worker.AskToAdopt): its polls carry an adopt command until it
// advertises the key or reports its host setup failed. A worker that may
// not (it changed since it was read: busy, keyed, gone) is refused with
// domain.ErrConflict.
func (s *Store) AskToAdopt(ctx context.Context, id string, a domain.Adoption, staleAfter time.Duration) (domain.Worker, error) {
	now := s.now()
	return s.updateWorker(ctx, "ask to adopt", id, nil, func(w domain.Worker) (domain.Worker, bool, error) {
		return w.AskToAdopt(a, now, staleAfter)
	})
}

// RequestDrain marks a worker draining (domain.Worker.Drain): it claims
// nothing more, and its next poll carries a drain command.
func (s *Store) RequestDrain(ctx context.Context, id string) (domain.Worker, error) {
	return s.updateWorker(ctx, "drain", id, nil, domain.Worker.Drain)
}

// AllowHandBack decides worker id's requeued ack, its daemon in phase
// (domain.Worker.MayHandBack), after auth: a refusal (a conflict) writes
// nothing; an ack whose phase is draining or terminating stores the worker
// draining first, so it claims nothing more.
func (s *Store) AllowHandBack(ctx context.Context, id string, phase domain.Phase, auth Authorize) (domain.Worker, error) {
	return s.updateWorker(ctx, "requeued ack", id, auth, func(w domain.Worker) (domain.Worker, bool, error) {
		return w.MayHandBack(phase)
	})
}
