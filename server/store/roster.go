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

// The workers table's roster index (template.yaml) holds every worker row
// under one partition, rosterPartition, ordered by roster_until: rosterLive
// while the sweep is not done with the worker (not reaped), then
// rosterGonePrefix + the Unix second it leaves the worker list (zero-padded,
// so the text orders as the number). The sweep, the host poller and the
// provisioner read the live part, the worker list everything from now on:
// neither reads a gone worker the sweep is done with, however many there
// are. The index holds keys only, so a heartbeat, which changes no key,
// never writes it.
const (
	indexRoster      = "roster"
	rosterPartition  = "worker"
	rosterLive       = "live"
	rosterGonePrefix = "gone#"
	// rosterForever is when a reaped worker leaves the list without a
	// retention: never.
	rosterForever = 999_999_999_999
)

// rosterUntil is w's roster_until (see indexRoster), with retention the
// store's WorkerRetention.
func rosterUntil(w domain.Worker, retention time.Duration) string {
	if !w.Reaped {
		return rosterLive
	}
	if retention <= 0 {
		return rosterAt(rosterForever)
	}
	return rosterAt(w.GoneSince().Add(retention).Unix())
}

func rosterAt(unix int64) string { return fmt.Sprintf("%s%012d", rosterGonePrefix, max(unix, 0)) }

// EachWorker calls fn for every worker the sweep is not done with (every
// row but the reaped gone ones: domain.Worker.Reap), read through the
// roster index and then in batches of whole rows (strongly consistent). A
// row that does not decode or an error from fn is collected and the
// others go on; a failed read ends it. op names the read in errors. Its
// cost follows the live fleet, never the workers that ever were. It is for
// off-path sweeps only (the reaper, the host-status poller, the
// provisioner).
func (s *Store) EachWorker(ctx context.Context, op string, fn func(domain.Worker) error) error {
	return s.eachRoster(ctx, op, "roster_until = :u", str(rosterLive), fn)
}

// EachListedWorker is EachWorker over the workers still in the worker list
// (domain.Listed: also the reaped ones within the retention).
func (s *Store) EachListedWorker(ctx context.Context, op string, fn func(domain.Worker) error) error {
	return s.eachRoster(ctx, op, "roster_until > :u", str(rosterAt(s.now().Unix())), fn)
}

func (s *Store) eachRoster(ctx context.Context, op, cond string, bound types.AttributeValue, fn func(domain.Worker) error) error {
	var ids []string
	err := s.queryEach(ctx, op, s.rosterQuery(cond, bound, 0), func(item map[string]types.AttributeValue) error {
		if v, ok := item["worker_id"].(*types.AttributeValueMemberS); ok {
			ids = append(ids, v.Value)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var errs []error
	err = s.batchGet(ctx, op, s.tables.Workers, "worker_id", ids, func(item map[string]types.AttributeValue) error {
		w, err := decodeWorker(item)
		if err == nil {
			err = fn(w)
		}
		errs = append(errs, err)
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// rosterQuery reads the roster index where roster_until meets cond (with
// :u bound), up to limit keys a page (0: as many as a page holds).
func (s *Store) rosterQuery(cond string, bound types.AttributeValue, limit int) *dynamodb.QueryInput {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Workers),
		IndexName:                 aws.String(indexRoster),
		KeyConditionExpression:    aws.String("roster = :r AND " + cond),
		ExpressionAttributeValues: map[string]types.AttributeValue{":r": str(rosterPartition), ":u": bound},
	}
	if limit > 0 {
		in.Limit = aws.Int32(int32(limit))
	}
	return in
}

// ListWorkers reads one page of the worker list: up to limit of the workers
// not yet out of it (live, or gone and within the retention), through the
// roster index, so the gone workers past their retention (whose rows TTL
// deletes some time later; emulators never) cost nothing. The cursor of
// the next page is "" after the last.
func (s *Store) ListWorkers(ctx context.Context, limit int, cursor string) ([]domain.Worker, string, error) {
	start, err := decodeCursor(cursor, map[string]string{"roster": rosterPartition}, "roster", "roster_until", "worker_id")
	if err != nil {
		return nil, "", err
	}
	in := s.rosterQuery("roster_until > :u", str(rosterAt(s.now().Unix())), limit)
	in.ExclusiveStartKey = start
	out, err := s.db.Query(ctx, in)
	if err != nil {
		return nil, "", storeErr("list workers", err)
	}
	ids := make([]string, 0, len(out.Items))
	for _, item := range out.Items {
		if v, ok := item["worker_id"].(*types.AttributeValueMemberS); ok {
			ids = append(ids, v.Value)
		}
	}
	byID := make(map[string]domain.Worker, len(ids))
	err = s.batchGet(ctx, "list workers", s.tables.Workers, "worker_id", ids, func(item map[string]types.AttributeValue) error {
		w, err := decodeWorker(item)
		byID[w.ID] = w
		return err
	})
	if err != nil {
		return nil, "", err
	}
	ws := make([]domain.Worker, 0, len(ids))
	for _, id := range ids {
		if w, ok := byID[id]; ok { // a row TTL deleted since the index was read is left out
			ws = append(ws, w)
		}
	}
	return ws, encodeCursor(out.LastEvaluatedKey), nil
}
