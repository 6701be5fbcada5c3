package store

import (
	"context"
	"errors"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// sweepGoneFor is how long after a worker went gone its holder index may
// still show a late claim (AWS GSIs are eventually consistent). The sweep
// keeps looking at a gone worker until a sweep after that finds it holding
// nothing; then it marks the worker reaped and never queries it again. Work
// is never stranded on a gone worker, and a sweep does not query every
// worker that ever lived.
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
	now := s.now()
	err := s.eachWorker(ctx, "sweep", func(w domain.Worker) error {
		res.Workers++
		why, lost := w.LostWhy(now, staleAfter)
		if !lost {
			return nil
		}
		res.Lost++
		n, err := s.RequeueHeld(ctx, w.ID, why)
		res.Requeued += n
		if err != nil {
			return err
		}
		if n == 0 && domain.Retired(w) && now.Sub(w.GoneSince()) > sweepGoneFor {
			return s.markReaped(ctx, w.ID)
		}
		return nil
	})
	return res, err
}

// eachWorker scans the workers table and calls fn for every row. A row that
// does not decode or an error from fn is collected and the scan goes on; a
// failed scan page ends it. It is for off-path sweeps only, never requests.
func (s *Store) eachWorker(ctx context.Context, op string, fn func(domain.Worker) error) error {
	var errs []error
	var start map[string]types.AttributeValue
	for {
		page, err := s.db.Scan(ctx, &dynamodb.ScanInput{
			TableName:         aws.String(s.tables.Workers),
			ExclusiveStartKey: start,
		})
		if err != nil {
			return errors.Join(append(errs, storeErr(op, err))...)
		}
		for _, item := range page.Items {
			w, err := decodeWorker(item)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if err := fn(w); err != nil {
				errs = append(errs, err)
			}
		}
		if page.LastEvaluatedKey == nil {
			return errors.Join(errs...)
		}
		start = page.LastEvaluatedKey
	}
}

// markReaped records that the sweep is done with gone worker id.
func (s *Store) markReaped(ctx context.Context, id string) error {
	_, err := s.updateWorker(ctx, "mark reaped", id, nil, noError(domain.Worker.Reap))
	return err
}
