package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// backfillMarker is the queues table's row that records a finished
// BackfillIndexes. No queue name starts with "!", and no listing reads it.
const backfillMarker = "!backfill#indexes-1"

// backfilled is set once this process knows the backfill is done.
type backfilled struct{ done atomic.Bool }

// BackfillIndexes brings rows written before the indexes that keep the hot
// paths independent of history (docs/scale.md) into those indexes, once
// per deployment, and reports how many rows it wrote:
//   - a worker row with no roster entry gets one, so the sweep finds a
//     worker that fell silent before the upgrade and hands back what it
//     ran (otherwise that work would wait for a poll that never comes);
//   - a queue's counter row gets its listing entry (NoteQueue);
//   - a run row gets its listing attributes, so the runs list shows it.
//
// Each write is an update conditional on the attribute still missing (and,
// for a worker, on the version read), so it never undoes a newer write: a
// row rewritten meanwhile has its entry already. A pass that ends without
// error writes a marker row; later calls, here or in another process,
// cost one read, and none at all once this process has seen the marker.
// Its two scans are the only reads of whole tables left, made once.
func (s *Store) BackfillIndexes(ctx context.Context) (int, error) {
	if s.backfill.done.Load() {
		return 0, nil
	}
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Queues), Key: key("queue", backfillMarker), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return 0, storeErr("backfill: read its marker", err)
	}
	if out.Item != nil {
		s.backfill.done.Store(true)
		return 0, nil
	}
	workers, werr := s.backfillWorkers(ctx)
	queues, qerr := s.backfillQueues(ctx)
	if err := errors.Join(werr, qerr); err != nil {
		return workers + queues, err
	}
	if _, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.tables.Queues), Item: key("queue", backfillMarker),
	}); err != nil {
		return workers + queues, storeErr("backfill: write its marker", err)
	}
	s.backfill.done.Store(true)
	return workers + queues, nil
}

// backfillWorkers gives each worker row without a roster entry its entry.
func (s *Store) backfillWorkers(ctx context.Context) (int, error) {
	n := 0
	err := s.scanEach(ctx, "backfill workers", &dynamodb.ScanInput{
		TableName:        aws.String(s.tables.Workers),
		FilterExpression: aws.String("attribute_not_exists(roster_until)"),
	}, func(item map[string]types.AttributeValue) error {
		wrote, err := s.backfillWorker(ctx, item)
		if wrote {
			n++
		}
		return err
	})
	return n, err
}

// backfillWorker gives the worker row item its roster entry, worked out
// from that row. A row rewritten since without one (by a process of the
// version before, during a rolling deploy) is read again and tried again;
// one rewritten with its entry, or gone, needs nothing.
func (s *Store) backfillWorker(ctx context.Context, item map[string]types.AttributeValue) (bool, error) {
	for range maxVersionRetries {
		w, err := decodeWorker(item)
		if err != nil {
			return false, err
		}
		k := key("worker_id", w.ID)
		wrote, err := s.setIfMissing(ctx, s.tables.Workers, k, "roster_until", w.Version, map[string]types.AttributeValue{
			"roster": str(rosterPartition), "roster_until": str(rosterUntil(w, s.WorkerRetention)),
		})
		if wrote || err != nil {
			return wrote, err
		}
		out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.tables.Workers), Key: k, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return false, storeErr("backfill: read worker "+w.ID, err)
		}
		if _, has := out.Item["roster_until"]; out.Item == nil || has {
			return false, nil
		}
		item = out.Item
	}
	return false, fmt.Errorf("backfill: worker row kept changing: %w", errVersion)
}

// backfillQueues writes the listing entry of each queue counter row and
// the listing attributes of each run row that lack them.
func (s *Store) backfillQueues(ctx context.Context) (int, error) {
	n := 0
	err := s.scanEach(ctx, "backfill queues", &dynamodb.ScanInput{
		TableName:        aws.String(s.tables.Queues),
		FilterExpression: aws.String("attribute_not_exists(listing)"),
	}, func(item map[string]types.AttributeValue) error {
		k, _ := item["queue"].(*types.AttributeValueMemberS)
		switch {
		case k == nil:
			return nil
		case strings.HasPrefix(k.Value, runKeyPrefix):
			var r runRecord
			if err := attributevalue.UnmarshalMap(item, &r); err != nil {
				return fmt.Errorf("backfill: decode run row %s: %w", k.Value, err)
			}
			wrote, err := s.setIfMissing(ctx, s.tables.Queues, key("queue", k.Value), "listing", 0, map[string]types.AttributeValue{
				"listing": str(runListing(r.Queue)), "listed": str(r.ID),
			})
			if wrote {
				n++
			}
			return err
		case domain.ValidQueue(k.Value):
			s.queuesNoted.Delete(k.Value) // write it, whatever this process noted
			if err := s.NoteQueue(ctx, k.Value); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// setIfMissing sets values on the item at k of table, if its attribute
// missing is still missing (and, with version > 0, the item is still at
// that version). It reports whether it wrote.
func (s *Store) setIfMissing(ctx context.Context, table string, k map[string]types.AttributeValue, missing string, version int64, values map[string]types.AttributeValue) (bool, error) {
	var sets []string
	names := map[string]string{"#m": missing}
	vals := map[string]types.AttributeValue{}
	i := 0
	for name, v := range values {
		n, p := "#a"+string(rune('0'+i)), ":a"+string(rune('0'+i))
		names[n], vals[p] = name, v
		sets = append(sets, n+" = "+p)
		i++
	}
	cond := "attribute_exists(#k) AND attribute_not_exists(#m)"
	for name := range k {
		names["#k"] = name
	}
	if version > 0 {
		cond += " AND version = :v"
		vals[":v"] = num(version)
	}
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: k,
		UpdateExpression:          aws.String("SET " + strings.Join(sets, ", ")),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: vals,
	})
	if isConditionFailed(err) {
		return false, nil // written meanwhile, with its entry
	}
	if err != nil {
		return false, storeErr("backfill "+table, err)
	}
	return true, nil
}

// scanEach is queryEach for a scan of a whole table.
func (s *Store) scanEach(ctx context.Context, op string, in *dynamodb.ScanInput, fn func(map[string]types.AttributeValue) error) error {
	for {
		page, err := s.db.Scan(ctx, in)
		if err != nil {
			return storeErr(op, err)
		}
		var errs []error
		for _, item := range page.Items {
			if err := fn(item); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if page.LastEvaluatedKey == nil {
			return nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
}
