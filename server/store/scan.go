package store

import (
	"context"
	"errors"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// errStopPaging, from queryEach's fn, ends the query early, with no error.
var errStopPaging = errors.New("stop paging")

// queryEach runs query in page by page and calls fn with every item, until
// the last page, an error (a failed page is wrapped with op), or fn
// answering errStopPaging.
func (s *Store) queryEach(ctx context.Context, op string, in *dynamodb.QueryInput, fn func(map[string]types.AttributeValue) error) error {
	for {
		page, err := s.db.Query(ctx, in)
		if err != nil {
			return storeErr(op, err)
		}
		for _, item := range page.Items {
			if err := fn(item); errors.Is(err, errStopPaging) {
				return nil
			} else if err != nil {
				return err
			}
		}
		if page.LastEvaluatedKey == nil {
			return nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
}

// MarkReaped records that the sweep is done with gone worker id
// (domain.Worker.Reap): later sweeps skip it.
func (s *Store) MarkReaped(ctx context.Context, id string) error {
	_, err := s.updateWorker(ctx, "mark reaped", id, nil, noError(domain.Worker.Reap))
	return err
}
