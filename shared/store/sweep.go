package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// sweepGoneFor is how long after a worker went gone the sweep still looks
// for work it held: long enough to catch a claim the holder index showed
// late (AWS GSIs are eventually consistent), short enough that a sweep does
// not query every worker that ever lived.
const sweepGoneFor = 10 * time.Minute

// SweepResult reports what one sweep did.
type SweepResult struct {
	Workers  int // workers read
	Lost     int // workers reading stale or gone whose work was looked for
	Requeued int // invocations handed back
}

// Sweep hands back the running work of every worker that reads stale
// (silent past staleAfter) or gone (bye, a new boot, a stopped or terminated
// host): each invocation goes back to the queue with attempt + 1 at its next
// claim, or fails as worker_lost once max_attempts is spent. The reaper runs
// it on a schedule; `lakeshore dev` on a ticker. It scans the workers table:
// an off-path sweep, never a claim.
func (s *Store) Sweep(ctx context.Context, staleAfter time.Duration) (SweepResult, error) {
	var res SweepResult
	var errs []error
	now := s.now()
	var start map[string]types.AttributeValue
	for {
		page, err := s.db.Scan(ctx, &dynamodb.ScanInput{
			TableName:         aws.String(s.tables.Workers),
			ExclusiveStartKey: start,
		})
		if err != nil {
			return res, storeErr("sweep", err)
		}
		for _, item := range page.Items {
			var w domain.Worker
			if err := unmarshal(item, &w); err != nil {
				errs = append(errs, err)
				continue
			}
			res.Workers++
			why, lost := lostWhy(w, now, staleAfter)
			if !lost {
				continue
			}
			res.Lost++
			n, err := s.RequeueHeld(ctx, w.ID, why)
			res.Requeued += n
			if err != nil {
				errs = append(errs, err)
			}
		}
		if page.LastEvaluatedKey == nil {
			return res, errors.Join(errs...)
		}
		start = page.LastEvaluatedKey
	}
}

// lostWhy reports whether w's work must be handed back at now, and why.
func lostWhy(w domain.Worker, now time.Time, staleAfter time.Duration) (string, bool) {
	switch domain.Project(w, now, staleAfter) {
	case domain.WorkerStale:
		return fmt.Sprintf("worker stale: silent for %s", now.Sub(w.LastSeenAt).Round(time.Second)), true
	case domain.WorkerGone:
		gone := w.GoneAt
		if gone.IsZero() {
			gone = w.LastSeenAt
		}
		if now.Sub(gone) > sweepGoneFor {
			return "", false
		}
		if w.HostStatus == domain.HostStopped || w.HostStatus == domain.HostTerminated {
			return "worker gone: host " + w.HostStatus, true
		}
		return "worker gone", true
	default:
		return "", false
	}
}
