package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// TestOneOutcomeOneTransaction pins the rule that keeps done_count honest
// where faults are hard to hit: an invocation becomes terminal in exactly
// one TransactWriteItems, and that same transaction adds one to its queue's
// done_count and to the count of its state. Nothing else ever writes the
// queues table's counters (NoteQueue sets a flag there, once a process). A counter moved by a separate request after the state
// write would be lost (or doubled) by a Lambda dying, or a retry landing,
// between the two — the tests with faults catch that when they hit it; this
// catches it always.
//
// It records every write the store sends while it drives each way to a
// terminal state: an ack of each outcome, an operator's cancel of a queued
// invocation, a requeue that spends the last attempt, a requeue that meets
// a pending cancel, and the sweep of a stale worker.
func TestOneOutcomeOneTransaction(t *testing.T) {
	db := storetest.Embedded(t)
	rec := &recordingDB{next: db}
	f := newFixture(t, backends[0], db)
	s := store.New(rec, strings.TrimSuffix(f.tables.Queues, store.QueuesSuffix))
	s.Clock, s.IDs = f.s.Clock, f.s.IDs
	f.s, f.svc = s, storetest.Control(s)
	tables := s.Tables()

	w := f.worker("m1", "")
	for _, state := range []domain.InvocationState{domain.StateSucceeded, domain.StateFailed} {
		inv := f.claimOne(w, f.submit(submitReq()))
		f.mustAck(w, inv, 1, state, true)
	}
	running := f.claimOne(w, f.submit(submitReq()))
	if _, err := f.s.Cancel(f.ctx, running.ID); err != nil {
		t.Fatalf("Cancel running: %v", err)
	}
	f.mustAck(w, running, 1, domain.StateCancelled, true)
	if _, err := f.s.Cancel(f.ctx, f.submit(submitReq()).ID); err != nil {
		t.Fatalf("Cancel queued: %v", err)
	}
	once := submitReq()
	once.MaxAttempts = 1
	spent := f.claimOne(w, f.submit(once))
	if got, _, err := f.s.Requeue(f.ctx, spent.ID, w.ID, domain.Loss{Kind: domain.EndStale, Why: "worker lost"}); err != nil || got.State != domain.StateFailed {
		t.Fatalf("Requeue with attempts spent = %s, %v", got.State, err)
	}
	pending := f.claimOne(w, f.submit(submitReq()))
	if _, err := f.s.Cancel(f.ctx, pending.ID); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if got, _, err := f.s.Requeue(f.ctx, pending.ID, w.ID, domain.Loss{Kind: domain.EndStale, Why: "worker lost"}); err != nil || got.State != domain.StateCancelled {
		t.Fatalf("Requeue with a cancel pending = %s, %v", got.State, err)
	}
	stale := f.claimOne(w, f.submit(once))
	f.clock.Advance(10 * time.Minute)
	if _, err := f.svc.Sweep(f.ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if got := f.get(stale.ID); got.State != domain.StateFailed {
		t.Fatalf("the swept invocation is %s, want failed", got.State)
	}

	want := map[domain.InvocationState]int{domain.StateSucceeded: 1, domain.StateFailed: 3, domain.StateCancelled: 3}
	got := map[domain.InvocationState]int{}
	for _, wr := range rec.writes() {
		terminal, counted, err := checkWrite(wr, tables)
		if err != nil {
			t.Error(err)
			continue
		}
		if terminal != "" && counted {
			got[terminal]++
		}
	}
	for state, n := range want {
		if got[state] != n {
			t.Errorf("%d transactions made an invocation %s and counted it, want %d (all: %v)", got[state], state, n, got)
		}
	}
	f.wantStats("q", want, 7)
}

// checkWrite checks one recorded write against the rule. It reports the
// terminal state an invocation put in it has ("" if none) and whether the
// write also counted it.
func checkWrite(wr any, tables store.TableNames) (terminal domain.InvocationState, counted bool, err error) {
	switch in := wr.(type) {
	case *dynamodb.PutItemInput:
		if aws.ToString(in.TableName) == tables.Queues {
			// The one put there: NoteQueue's listing entry, which holds no
			// counter.
			for name := range in.Item {
				if strings.HasSuffix(name, "_count") {
					return "", false, fmt.Errorf("a PutItem on the queues table with %s: counters move only with an outcome", name)
				}
			}
			if k, ok := in.Item["queue"].(*types.AttributeValueMemberS); !ok || !strings.HasPrefix(k.Value, "!queue#") {
				return "", false, fmt.Errorf("a PutItem on the queues table that is not a queue's listing entry: counters move only with an outcome")
			}
			return "", false, nil
		}
		if st := terminalState(in.TableName, in.Item, tables); st != "" {
			return st, false, fmt.Errorf("a PutItem made an invocation %s outside a transaction with its counters", st)
		}
	case *dynamodb.UpdateItemInput:
		switch aws.ToString(in.TableName) {
		case tables.Queues:
			return "", false, fmt.Errorf("an UpdateItem on the queues table (%s): counters move only with an outcome", aws.ToString(in.UpdateExpression))
		case tables.Invocations:
			return "", false, fmt.Errorf("an UpdateItem on the invocations table (%s): a state change is a versioned put", aws.ToString(in.UpdateExpression))
		}
	case *dynamodb.TransactWriteItemsInput:
		var counters []*types.Update
		var states []domain.InvocationState
		for _, item := range in.TransactItems {
			if p := item.Put; p != nil {
				if st := terminalState(p.TableName, p.Item, tables); st != "" {
					states = append(states, st)
				}
				if aws.ToString(p.TableName) == tables.Queues {
					return "", false, fmt.Errorf("a transaction puts a queues row: counters are only ever added to")
				}
			}
			if u := item.Update; u != nil && aws.ToString(u.TableName) == tables.Queues {
				counters = append(counters, u)
			}
		}
		switch {
		case len(states) == 0 && len(counters) == 0:
			return "", false, nil
		case len(states) != 1 || len(counters) != 1:
			return "", false, fmt.Errorf("a transaction with %d terminal invocations and %d counter updates, want one of each", len(states), len(counters))
		}
		u := counters[0]
		expr := aws.ToString(u.UpdateExpression)
		if expr != "ADD done_count :one, #s :one" || u.ExpressionAttributeNames["#s"] != string(states[0])+"_count" {
			return states[0], false, fmt.Errorf("the counter update %q (#s = %s) does not add one to done_count and %s_count", expr, u.ExpressionAttributeNames["#s"], states[0])
		}
		if n, ok := u.ExpressionAttributeValues[":one"].(*types.AttributeValueMemberN); !ok || n.Value != "1" {
			return states[0], false, fmt.Errorf("the counter update adds %v, want 1", u.ExpressionAttributeValues[":one"])
		}
		return states[0], true, nil
	}
	return "", false, nil
}

// terminalState is the terminal state of an invocation row put into table,
// or "".
func terminalState(table *string, item map[string]types.AttributeValue, tables store.TableNames) domain.InvocationState {
	if aws.ToString(table) != tables.Invocations {
		return ""
	}
	if s, ok := item["state"].(*types.AttributeValueMemberS); ok && domain.InvocationState(s.Value).Terminal() {
		return domain.InvocationState(s.Value)
	}
	return ""
}

// recordingDB passes every call to next and records the write requests.
// It spells out every method of store.DB (no embedding), so a new method
// the store starts using must be added here, and thought about.
type recordingDB struct {
	next store.DB
	mu   sync.Mutex
	log  []any
}

var _ store.DB = (*recordingDB)(nil)

func (r *recordingDB) record(in any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, in)
}

func (r *recordingDB) writes() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]any(nil), r.log...)
}

func (r *recordingDB) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return r.next.GetItem(ctx, in, o...)
}

func (r *recordingDB) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	r.record(in)
	return r.next.PutItem(ctx, in, o...)
}

func (r *recordingDB) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	r.record(in)
	return r.next.UpdateItem(ctx, in, o...)
}

func (r *recordingDB) Query(ctx context.Context, in *dynamodb.QueryInput, o ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	return r.next.Query(ctx, in, o...)
}

func (r *recordingDB) Scan(ctx context.Context, in *dynamodb.ScanInput, o ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	return r.next.Scan(ctx, in, o...)
}

func (r *recordingDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	r.record(in)
	return r.next.TransactWriteItems(ctx, in, o...)
}

func (r *recordingDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return r.next.BatchGetItem(ctx, in, o...)
}
