package store

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// ListInvocations pages through invocations, optionally of one queue and
// one state, oldest first (ListQuery).
func (s *Store) ListInvocations(ctx context.Context, queue string, state domain.InvocationState, limit int, cursor string) ([]domain.Invocation, string, error) {
	return s.List(ctx, ListQuery{Queue: queue, State: state, Limit: limit, Cursor: cursor})
}

// Listing orders (ListQuery.Order): by id, which is by creation time (ids
// are ULIDs). They are the API's order= values.
const (
	OrderOldest = "oldest"
	OrderNewest = "newest"
)

// ListQuery selects a page of invocations: of one queue or every queue,
// optionally in one state, in an order.
type ListQuery struct {
	Queue string
	State domain.InvocationState
	// Order is OrderOldest or OrderNewest (by id: by creation
	// time), or "" for oldest first where an index orders the listing and
	// no particular order for the whole table.
	Order  string
	Limit  int
	Cursor string
	// IDPrefix, when set, keeps the invocations whose id starts with it
	// (a range of the indexes' sort key: ids are ULIDs, so a prefix is a
	// span of creation time). Without a queue, a state or an order it
	// reads every queue's index, oldest first.
	IDPrefix string
}

// across reports whether q lists every queue's partition of an index and
// merges them by id: no queue, but a state, an order or an id prefix (a
// range of an index, read in order).
func (q ListQuery) across() bool {
	return q.Queue == "" && (q.State != "" || q.Order != "" || q.IDPrefix != "")
}

// CursorAt reports the cursor of q's listing that stands at invocation id:
// given back with q in the other order, it reads what lies on id's other
// side (the page before one that starts at id), nearest first. It is ""
// for a listing with no order (a table scan).
func CursorAt(q ListQuery, id string) string {
	k := map[string]types.AttributeValue{"invocation_id": str(id)}
	switch {
	case q.Queue != "" && q.State != "":
		k["queue_state"] = str(queueState(q.Queue, q.State))
	case q.Queue != "":
		k["queue"] = str(q.Queue)
	case q.across():
		k = map[string]types.AttributeValue{listCursorKey: str(id)}
	default:
		return ""
	}
	return encodeCursor(k)
}

// List answers one page of q and the cursor of the next ("": none).
//
// Of one queue it reads the queue (or queue_state) index, in id order.
// Without a queue but with a state or an order it reads each queue's
// partition of that index, as many as the page holds from each, and merges
// them by id: its cost follows the page and the number of queues, not the
// table, and live work (queued, running) is found however long the
// history. Queues are those the queues table names (NoteQueue). Without a
// queue, a state or an order it scans the table (no particular order).
func (s *Store) List(ctx context.Context, q ListQuery) ([]domain.Invocation, string, error) {
	if q.across() {
		return s.listAcross(ctx, q) // no order is oldest first
	}
	var start map[string]types.AttributeValue
	var err error
	switch {
	case q.Queue != "" && q.State != "":
		start, err = decodeCursor(q.Cursor, map[string]string{"queue_state": queueState(q.Queue, q.State)}, "queue_state", "invocation_id")
	case q.Queue != "":
		start, err = decodeCursor(q.Cursor, map[string]string{"queue": q.Queue}, "queue", "invocation_id")
	default:
		start, err = decodeCursor(q.Cursor, nil, "invocation_id")
	}
	if err != nil {
		return nil, "", err
	}
	if v, ok := start["invocation_id"].(*types.AttributeValueMemberS); ok && q.IDPrefix != "" && !strings.HasPrefix(v.Value, q.IDPrefix) {
		// DynamoDB refuses a start key outside the key condition's range
		// (a ValidationException): a cursor of another prefix's listing.
		return nil, "", domain.Errorf(domain.KindInvalid, "cursor is not one this listing returned")
	}
	var items []map[string]types.AttributeValue
	var last map[string]types.AttributeValue
	if q.Queue != "" {
		in := s.queueQuery(q.Queue, q.State, q.Order, q.Limit)
		in.ExclusiveStartKey = start
		if q.IDPrefix != "" {
			*in.KeyConditionExpression += " AND begins_with(invocation_id, :p)"
			in.ExpressionAttributeValues[":p"] = str(q.IDPrefix)
		}
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return nil, "", storeErr("list invocations", err)
		}
		items, last = out.Items, out.LastEvaluatedKey
	} else {
		out, err := s.db.Scan(ctx, &dynamodb.ScanInput{
			TableName:         aws.String(s.tables.Invocations),
			Limit:             aws.Int32(int32(q.Limit)),
			ExclusiveStartKey: start,
		})
		if err != nil {
			return nil, "", storeErr("list invocations", err)
		}
		items, last = out.Items, out.LastEvaluatedKey
	}
	var invs []domain.Invocation
	if q.Queue != "" {
		invs, err = s.listed(ctx, idsOf(items), q.State)
	} else {
		invs, err = decodeInvocations(items)
	}
	if err != nil {
		return nil, "", err
	}
	return invs, encodeCursor(last), nil
}

// idsOf reports the invocation ids of items, in order.
func idsOf(items []map[string]types.AttributeValue) []string {
	out := make([]string, 0, len(items))
	for _, item := range items {
		if v, ok := item["invocation_id"].(*types.AttributeValueMemberS); ok {
			out = append(out, v.Value)
		}
	}
	return out
}

// listed reads the invocations an index listed by id, in that order. The
// queue and queue_state indexes project only keys and the few attributes
// their counting readers take, so that a write of an invocation rewrites
// small index entries, or none (docs/cost.md): a listing reads the items
// from the table, in batches. One gone meanwhile (expired) is left out,
// and so is one no longer in state, when state is set: the index lags its
// table, and a listing by state shows only invocations in that state.
func (s *Store) listed(ctx context.Context, ids []string, state domain.InvocationState) ([]domain.Invocation, error) {
	found, err := s.GetInvocations(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]domain.Invocation, 0, len(ids))
	for _, id := range ids {
		if inv, ok := found[id]; ok && (state == "" || inv.State == state) {
			out = append(out, inv)
		}
	}
	return out, nil
}

// queueQuery reads up to limit invocations of queue (in state, if set)
// from the queue or queue_state index, in order.
func (s *Store) queueQuery(queue string, state domain.InvocationState, order string, limit int) *dynamodb.QueryInput {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexQueue),
		KeyConditionExpression:    aws.String("#q = :q"),
		ExpressionAttributeNames:  map[string]string{"#q": "queue"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queue)},
		Limit:                     aws.Int32(int32(limit)),
		ScanIndexForward:          aws.Bool(order != OrderNewest),
	}
	if state != "" {
		in.IndexName = aws.String(indexQueueState)
		in.ExpressionAttributeNames["#q"] = "queue_state"
		in.ExpressionAttributeValues[":q"] = str(queueState(queue, state))
	}
	return in
}

// listCursorKey is the one attribute of a cursor of a listing across
// queues: the id the page ended at (ids order the merge, so the next page
// starts past it in every queue).
const listCursorKey = "listed_to"

// listAcross answers a page of q (no queue) merged from every queue's
// partition of the queue or queue_state index.
func (s *Store) listAcross(ctx context.Context, q ListQuery) ([]domain.Invocation, string, error) {
	start, err := decodeCursor(q.Cursor, nil, listCursorKey)
	if err != nil {
		return nil, "", err
	}
	newest := q.Order == OrderNewest
	bound := ""
	if start != nil {
		bound = start[listCursorKey].(*types.AttributeValueMemberS).Value
		if !ids.Valid(ids.Invocation, bound) {
			return nil, "", domain.Errorf(domain.KindInvalid, "cursor is not one this listing returned")
		}
	}
	queues, err := s.Queues(ctx)
	if err != nil {
		return nil, "", err
	}
	var ids []string
	more := false
	cond, values, none := idRange(q.IDPrefix, bound, newest)
	if none {
		return []domain.Invocation{}, "", nil
	}
	for _, queue := range queues {
		// One more than the page: a range that holds the bound reads it
		// again, and it is dropped.
		in := s.queueQuery(queue, q.State, q.Order, q.Limit+1)
		if cond != "" {
			*in.KeyConditionExpression += " AND " + cond
			maps.Copy(in.ExpressionAttributeValues, values)
		}
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return nil, "", storeErr("list invocations of "+queue, err)
		}
		ids = append(ids, slices.DeleteFunc(idsOf(out.Items), func(id string) bool { return id == bound })...)
		more = more || out.LastEvaluatedKey != nil
	}
	slices.Sort(ids)
	if newest {
		slices.Reverse(ids)
	}
	if len(ids) > q.Limit {
		ids, more = ids[:q.Limit], true
	}
	invs, err := s.listed(ctx, ids, q.State)
	if err != nil {
		return nil, "", err
	}
	if !more || len(ids) == 0 {
		return invs, "", nil
	}
	// The page ends at the last id listed, kept or not.
	return invs, encodeCursor(map[string]types.AttributeValue{listCursorKey: str(ids[len(ids)-1])}), nil
}

// idRange is the key condition on invocation_id of a listing across
// queues: ids starting with prefix (if set), past bound (if set: below it
// newest first, above it oldest first). A range that holds bound may read
// it (BETWEEN is inclusive): the caller drops it. none reports that no id
// can match. Ids are ASCII letters, digits and "_", all below "~".
func idRange(prefix, bound string, newest bool) (cond string, values map[string]types.AttributeValue, none bool) {
	hi := prefix + "~"
	values = map[string]types.AttributeValue{}
	switch {
	case prefix == "" && bound == "":
		return "", nil, false
	case prefix == "":
		values[":b"] = str(bound)
		if newest {
			return "invocation_id < :b", values, false
		}
		return "invocation_id > :b", values, false
	case bound == "" || (newest && bound >= hi) || (!newest && bound < prefix):
		values[":p"] = str(prefix)
		return "begins_with(invocation_id, :p)", values, false
	case newest && bound <= prefix, !newest && bound >= hi:
		return "", nil, true
	case newest:
		values[":lo"], values[":hi"] = str(prefix), str(bound)
	default:
		values[":lo"], values[":hi"] = str(bound), str(hi)
	}
	return "invocation_id BETWEEN :lo AND :hi", values, false
}

func decodeInvocations(items []map[string]types.AttributeValue) ([]domain.Invocation, error) {
	invs := make([]domain.Invocation, 0, len(items))
	for _, item := range items {
		inv, err := decodeInvocation(item)
		if err != nil {
			return nil, err
		}
		invs = append(invs, inv)
	}
	return invs, nil
}
