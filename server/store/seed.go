package store

import (
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// InvocationItem is the item a put of inv writes, with the attributes its
// indexes are keyed on: what test support writes in bulk (BatchWriteItem)
// to give a store a long history without a request per invocation.
func (s *Store) InvocationItem(inv domain.Invocation) (map[string]types.AttributeValue, error) {
	if inv.Version == 0 {
		inv.Version = 1
	}
	item, err := s.invocationItem(inv)
	return dropEmpty(item), err
}

// WorkerItem is the item a put of w writes (WorkerItem's use is
// InvocationItem's).
func (s *Store) WorkerItem(w domain.Worker) (map[string]types.AttributeValue, error) {
	put, err := s.workerPut(max(w.Version-1, 0), &w)
	if err != nil {
		return nil, err
	}
	return put.Item, nil
}

// RunItem is the item a put of run r writes (RunItem's use is
// InvocationItem's).
func (s *Store) RunItem(r domain.Run) (map[string]types.AttributeValue, error) {
	item, err := attributevalue.MarshalMap(toRunRecord(r))
	return dropEmpty(item), err
}
