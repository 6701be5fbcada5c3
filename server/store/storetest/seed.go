package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/clock"
)

// batchWriteMost is the most items one BatchWriteItem request takes.
const batchWriteMost = 25

// seedWriters is how many of BatchPut's requests are in flight at once.
const seedWriters = 8

// BatchPut writes items to table unconditionally, 25 a request and a few
// requests at once, retrying what the server leaves unprocessed: how tests
// seed a long history (store.Store.InvocationItem and its siblings encode
// the items) in seconds rather than a request per item.
func BatchPut(ctx context.Context, db *dynamodb.Client, table string, items []map[string]types.AttributeValue) error {
	chunks := slices.Collect(slices.Chunk(items, batchWriteMost))
	errs := make([]error, seedWriters)
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	for w := range seedWriters {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(chunks) {
					return
				}
				if err := batchWrite(ctx, db, table, chunks[i]); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// batchWrite writes one chunk of at most 25 items, retrying unprocessed
// ones a bounded number of times.
func batchWrite(ctx context.Context, db *dynamodb.Client, table string, chunk []map[string]types.AttributeValue) error {
	reqs := make([]types.WriteRequest, len(chunk))
	for i, item := range chunk {
		reqs[i] = types.WriteRequest{PutRequest: &types.PutRequest{Item: item}}
	}
	req := map[string][]types.WriteRequest{table: reqs}
	for try := range 10 {
		if try > 0 {
			if err := clock.Sleep(ctx, time.Duration(try)*20*time.Millisecond); err != nil {
				return err
			}
		}
		out, err := db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: req})
		if err != nil {
			return fmt.Errorf("seed %s: %w", table, err)
		}
		if len(out.UnprocessedItems) == 0 {
			return nil
		}
		req = out.UnprocessedItems
	}
	return fmt.Errorf("seed %s: items left unprocessed after every retry", table)
}
