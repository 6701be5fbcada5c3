package storetest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// faultRig is a one-table embedded DynamoDB reached twice: through a
// FaultyTransport (db) and directly (truth), to read what really landed.
type faultRig struct {
	ctx   context.Context
	table *string
	truth *dynamodb.Client
	tr    *storetest.FaultyTransport
	db    *dynamodb.Client
}

// newFaultRig creates a table with a string hash key "k". timeout is the
// faulty client's per-attempt timeout (zero: none); a Delay fault holds its
// request for hold (zero: the transport's default).
func newFaultRig(t *testing.T, s storetest.Schedule, timeout, hold time.Duration) *faultRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	endpoint := storetest.EmbeddedEndpoint(t)
	r := &faultRig{ctx: ctx, table: aws.String(storetest.Prefix(t) + "faults"), truth: storetest.Client(endpoint)}
	if _, err := r.truth.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            r.table,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("k"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("k"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	}); err != nil {
		t.Fatalf("create table: %v", err)
	}
	r.tr = storetest.NewFaultyTransport(s)
	r.tr.Hold = hold
	t.Cleanup(r.tr.Settle) // runs before the server closes (cleanups are LIFO)
	r.db = storetest.FaultyClient(endpoint, r.tr, timeout)
	return r
}

// noRetry turns the SDK's retries off for one call, so the call's error is
// its first attempt's.
func noRetry(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

func item(k, v string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: k}, "v": &types.AttributeValueMemberS{Value: v}}
}

func (r *faultRig) put(k, v string, opts ...func(*dynamodb.Options)) error {
	_, err := r.db.PutItem(r.ctx, &dynamodb.PutItemInput{TableName: r.table, Item: item(k, v)}, opts...)
	return err
}

// read returns k's value as the table holds it, read without faults.
func (r *faultRig) read(t *testing.T, k string) (string, bool) {
	t.Helper()
	out, err := r.truth.GetItem(r.ctx, &dynamodb.GetItemInput{TableName: r.table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: k}}})
	if err != nil {
		t.Fatalf("get %s: %v", k, err)
	}
	if out.Item == nil {
		return "", false
	}
	return out.Item["v"].(*types.AttributeValueMemberS).Value, true
}

func inj(op string, n, seq int, f storetest.Fault) storetest.Injected {
	return storetest.Injected{Call: storetest.Call{Op: op, N: n, Seq: seq}, Fault: f}
}

// injectedOf is the faults r injected so far, without the table each one
// met (a rig has one table).
func injectedOf(r *faultRig) []storetest.Injected {
	got := r.tr.Injected()
	for i := range got {
		got[i].Table = ""
	}
	return got
}

// TestFaultEveryAttemptFailsBefore proves a schedule failing every attempt
// exhausts the SDK's 3 attempts, each counted as its own call, and that
// nothing was applied.
func TestFaultEveryAttemptFailsBefore(t *testing.T) {
	r := newFaultRig(t, func(storetest.Call) storetest.Fault { return storetest.FailBefore }, 0, 0)
	if err := r.put("a", "1"); !storetest.ErrInjected(err) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("put: err = %v, want an injected connection refused", err)
	}
	if _, ok := r.read(t, "a"); ok {
		t.Fatalf("a was applied although no attempt was sent")
	}
	want := []storetest.Injected{inj("PutItem", 1, 1, storetest.FailBefore),
		inj("PutItem", 2, 2, storetest.FailBefore), inj("PutItem", 3, 3, storetest.FailBefore)}
	if got := injectedOf(r); !slices.Equal(got, want) {
		t.Fatalf("Injected = %v, want %v", got, want)
	}
}

// TestFaultKindsApplyOrNot proves, with SDK retries off, what the client
// sees for each fault and whether the write landed anyway.
func TestFaultKindsApplyOrNot(t *testing.T) {
	for _, tc := range []struct {
		fault   storetest.Fault
		applied bool
		check   func(error) bool // recognises the client's error
	}{
		{storetest.FailBefore, false, func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }},
		{storetest.FailAfter, true, func(err error) bool {
			_, ise := errors.AsType[*types.InternalServerError](err)
			re, ok := errors.AsType[*awshttp.ResponseError](err)
			return ise && ok && re.HTTPStatusCode() == 500
		}},
		{storetest.DropAfter, true, func(err error) bool { return errors.Is(err, syscall.ECONNRESET) }},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			r := newFaultRig(t, storetest.Nth("PutItem", 1, tc.fault), 0, 0)
			err := r.put("a", "1", noRetry)
			if err == nil || !tc.check(err) {
				t.Fatalf("put: err = %v, want the error of %s", err, tc.fault)
			}
			if !storetest.ErrInjected(err) {
				t.Errorf("ErrInjected(%v) = false, want true", err)
			}
			if _, ok := r.read(t, "a"); ok != tc.applied {
				t.Fatalf("after %s: item present = %t, want %t", tc.fault, ok, tc.applied)
			}
		})
	}
}

// TestFaultDelayLandsLate proves a Delay fault times the client out and
// still applies the write, after the client has given up. (It fails while
// delay() sends a req.Clone that keeps req.Cancel: http.Client closes that
// channel on its timeout, so the held request is cancelled unsent.)
func TestFaultDelayLandsLate(t *testing.T) {
	const timeout, hold = 200 * time.Millisecond, time.Second // hold ≥ 3× timeout
	t.Run("no-retry", func(t *testing.T) {
		r := newFaultRig(t, storetest.Nth("PutItem", 1, storetest.Delay), timeout, hold)
		err := r.put("a", "1", noRetry)
		if !errors.Is(err, context.DeadlineExceeded) || !storetest.ErrInjected(err) {
			t.Fatalf("put: err = %v, want a client timeout", err)
		}
		r.tr.Settle()
		if _, ok := r.read(t, "a"); !ok {
			t.Fatalf("the delayed put never landed")
		}
	})
	// With retries on, the second attempt lands at once; a later write
	// then goes in, and the held first attempt lands last, undoing it. This
	// is the hazard Delay models, and proves the held request is sent late.
	t.Run("retry-then-stale-write", func(t *testing.T) {
		r := newFaultRig(t, storetest.Nth("PutItem", 1, storetest.Delay), timeout, hold)
		if err := r.put("a", "old"); err != nil {
			t.Fatalf("put old: %v", err)
		}
		if err := r.put("a", "new"); err != nil {
			t.Fatalf("put new: %v", err)
		}
		r.tr.Settle()
		if v, _ := r.read(t, "a"); v != "old" {
			t.Fatalf("after Settle a = %q, want the late %q", v, "old")
		}
		want := []storetest.Injected{inj("PutItem", 1, 1, storetest.Delay)}
		if got := injectedOf(r); !slices.Equal(got, want) {
			t.Fatalf("Injected = %v, want %v", got, want)
		}
	})
}

// TestNextInAimsAtOneTable: NextIn injects into the next requests of its
// operation to its table only, however many of that operation go to other
// tables first, then nothing.
func TestNextInAimsAtOneTable(t *testing.T) {
	r := newFaultRig(t, nil, 0, 0)
	other := aws.String(*r.table + "-other")
	if _, err := r.truth.CreateTable(r.ctx, &dynamodb.CreateTableInput{
		TableName:            other,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("k"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("k"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	}); err != nil {
		t.Fatal(err)
	}
	r.tr.NextIn("PutItem", *r.table, storetest.FailBefore)
	if _, err := r.db.PutItem(r.ctx, &dynamodb.PutItemInput{TableName: other, Item: item("a", "1")}, noRetry); err != nil {
		t.Fatalf("a put to another table met a fault: %v", err)
	}
	if err := r.put("a", "1", noRetry); err == nil {
		t.Fatal("the first put to the aimed table got through, want the fault")
	}
	if err := r.put("a", "1", noRetry); err != nil {
		t.Fatalf("the second put to the aimed table: %v; want no more faults", err)
	}
	if got := r.tr.Injected(); len(got) != 1 || got[0].Table != *r.table || got[0].N != 2 {
		t.Fatalf("Injected = %+v; want one fault, the 2nd PutItem, to %s", got, *r.table)
	}
}

// TestFaultCallNumbering proves N counts per operation and Seq across all
// (both 1-based, every HTTP attempt counted), that Nth hits only the n-th
// call of its operation, that the SDK's retry of it (a new call) gets
// through, and how the fault is logged.
func TestFaultCallNumbering(t *testing.T) {
	var mu sync.Mutex
	var calls []storetest.Call
	nth := storetest.Nth("PutItem", 2, storetest.FailBefore)
	r := newFaultRig(t, func(c storetest.Call) storetest.Fault {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, c)
		return nth(c)
	}, 0, 0)
	for _, k := range []string{"a", "b"} {
		if err := r.put(k, "1"); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		if _, err := r.db.GetItem(r.ctx, &dynamodb.GetItemInput{TableName: r.table,
			Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: k}}}); err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		if _, ok := r.read(t, k); !ok {
			t.Fatalf("%s missing after a successful put", k)
		}
	}
	tb := *r.table
	wantCalls := []storetest.Call{
		{Op: "PutItem", N: 1, Seq: 1, Table: tb}, {Op: "GetItem", N: 1, Seq: 2, Table: tb},
		{Op: "PutItem", N: 2, Seq: 3, Table: tb}, {Op: "PutItem", N: 3, Seq: 4, Table: tb}, // the SDK's retry
		{Op: "GetItem", N: 2, Seq: 5, Table: tb},
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(calls, wantCalls) {
		t.Fatalf("calls = %+v, want %+v", calls, wantCalls)
	}
	got := injectedOf(r)
	if want := []storetest.Injected{inj("PutItem", 2, 3, storetest.FailBefore)}; !slices.Equal(got, want) {
		t.Fatalf("Injected = %v, want %v", got, want)
	}
	if s := got[0].String(); s != "PutItem#2 (seq 3): fail-before" {
		t.Fatalf("Injected.String = %q", s)
	}
	got[0].N = 99 // Injected returns the caller's copy
	if r.tr.Injected()[0].N != 2 {
		t.Fatalf("writing Injected's result changed the transport's log")
	}
}

func TestFaultString(t *testing.T) {
	for f, want := range map[storetest.Fault]string{
		storetest.NoFault: "none", storetest.FailBefore: "fail-before", storetest.FailAfter: "fail-after(500)",
		storetest.DropAfter: "drop-after", storetest.Delay: "delay", storetest.Fault(9): "fault(9)",
	} {
		if got := f.String(); got != want {
			t.Errorf("Fault(%d).String() = %q, want %q", int(f), got, want)
		}
	}
	if got := inj("TransactWriteItems", 3, 17, storetest.FailAfter).String(); got != "TransactWriteItems#3 (seq 17): fail-after(500)" {
		t.Errorf("Injected.String() = %q", got)
	}
}

// decide runs s over n synthetic calls and returns its decisions.
func decide(s storetest.Schedule, n int) []storetest.Fault {
	out := make([]storetest.Fault, n)
	for i := range out {
		out[i] = s(storetest.Call{Op: "PutItem", N: i + 1, Seq: i + 1})
	}
	return out
}

func kinds(fs []storetest.Fault) map[storetest.Fault]int {
	m := map[storetest.Fault]int{}
	for _, f := range fs {
		m[f]++
	}
	return m
}

// TestRandomSchedule proves Random is replayable by seed and keeps to its
// rate and fault kinds.
func TestRandomSchedule(t *testing.T) {
	const n = 1000
	a, b := decide(storetest.Random(42, 0.3), n), decide(storetest.Random(42, 0.3), n)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different decisions")
	}
	if slices.Equal(a, decide(storetest.Random(43, 0.3), n)) {
		t.Fatalf("seeds 42 and 43 made the same %d decisions", n)
	}
	if k := kinds(a); k[storetest.NoFault] < 600 || k[storetest.NoFault] > 800 {
		t.Errorf("rate 0.3: %d of %d calls without fault, want about 700", k[storetest.NoFault], n)
	}
	if k := kinds(decide(storetest.Random(42, 0), n)); k[storetest.NoFault] != n {
		t.Errorf("rate 0 injected faults: %v", k)
	}
	if k := kinds(decide(storetest.Random(42, 1), n)); k[storetest.NoFault] != 0 {
		t.Errorf("rate 1 left %d calls without fault", k[storetest.NoFault])
	}
	only := kinds(decide(storetest.Random(7, 0.5, storetest.FailAfter, storetest.Delay), n))
	if len(only) != 3 || only[storetest.FailAfter] == 0 || only[storetest.Delay] == 0 {
		t.Errorf("Random(FailAfter, Delay) drew %v, want none, fail-after and delay", only)
	}
	all := kinds(decide(storetest.Random(7, 0.5), n))
	for _, f := range []storetest.Fault{storetest.NoFault, storetest.FailBefore, storetest.FailAfter, storetest.DropAfter, storetest.Delay} {
		if all[f] == 0 {
			t.Errorf("Random without kinds never drew %s: %v", f, all)
		}
	}
	if len(all) != 5 {
		t.Errorf("Random without kinds drew %v", all)
	}
}

// TestFaultSetSchedule proves nil means Never and that call counts go on
// across SetSchedule (a new Nth does not restart at 1).
func TestFaultSetSchedule(t *testing.T) {
	r := newFaultRig(t, nil, 0, 0)
	for i, step := range []struct {
		schedule storetest.Schedule // set before PutItem#i+1
		fail     bool
	}{
		{nil, false},
		{storetest.Nth("PutItem", 1, storetest.FailBefore), false}, // #1 is past
		{storetest.Nth("PutItem", 3, storetest.FailBefore), true},
		{nil, false},
	} {
		r.tr.SetSchedule(step.schedule)
		if err := r.put("a", "1", noRetry); (err != nil) != step.fail || (err != nil && !storetest.ErrInjected(err)) {
			t.Fatalf("PutItem#%d: err = %v, want a fault: %t", i+1, err, step.fail)
		}
	}
	if got, want := injectedOf(r), []storetest.Injected{inj("PutItem", 3, 3, storetest.FailBefore)}; !slices.Equal(got, want) {
		t.Fatalf("Injected = %v, want %v", got, want)
	}
}

// TestErrInjectedRejectsOthers proves ErrInjected is false for no error, an
// unrelated error and a real DynamoDB error that came through the transport.
func TestErrInjectedRejectsOthers(t *testing.T) {
	r := newFaultRig(t, storetest.Never(), 0, 0)
	if err := r.put("a", "1"); err != nil {
		t.Fatalf("put: %v", err)
	}
	_, condErr := r.db.PutItem(r.ctx, &dynamodb.PutItemInput{TableName: r.table, Item: item("a", "2"),
		ConditionExpression: aws.String("attribute_not_exists(k)")})
	if _, ok := errors.AsType[*types.ConditionalCheckFailedException](condErr); !ok {
		t.Fatalf("conditional put: err = %v, want ConditionalCheckFailedException", condErr)
	}
	for _, err := range []error{nil, errors.New("boom"), condErr} {
		if storetest.ErrInjected(err) {
			t.Errorf("ErrInjected(%v) = true, want false", err)
		}
	}
}

// TestFaultAfterThenRetryFailsCondition documents why callers must re-read
// after an unanswered write: the first attempt of a create-if-absent was
// applied, so the SDK's retry finds the item and fails its condition, and
// the caller sees a refusal for a write that succeeded.
//
// For TransactWriteItems the SDK fills in ClientRequestToken, and real
// DynamoDB answers a retry with the same token (within 10 minutes) as it
// answered the first: there the retry would succeed. minidyn v0.8.2 (the
// embedded store) ignores the token, so here the retry is cancelled. A
// conditional PutItem has no token and fails the same way on both.
func TestFaultAfterThenRetryFailsCondition(t *testing.T) {
	cond := aws.String("attribute_not_exists(k)")
	for _, tc := range []struct {
		op    string
		write func(r *faultRig) error
		want  func(error) bool
	}{
		{"PutItem", func(r *faultRig) error {
			_, err := r.db.PutItem(r.ctx, &dynamodb.PutItemInput{TableName: r.table, Item: item("a", "1"), ConditionExpression: cond})
			return err
		}, func(err error) bool { _, ok := errors.AsType[*types.ConditionalCheckFailedException](err); return ok }},
		{"TransactWriteItems", func(r *faultRig) error {
			_, err := r.db.TransactWriteItems(r.ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
				{Put: &types.Put{TableName: r.table, Item: item("a", "1"), ConditionExpression: cond}},
			}})
			return err
		}, func(err error) bool { _, ok := errors.AsType[*types.TransactionCanceledException](err); return ok }},
	} {
		t.Run(tc.op, func(t *testing.T) {
			r := newFaultRig(t, storetest.Nth(tc.op, 1, storetest.FailAfter), 0, 0)
			if err := tc.write(r); !tc.want(err) {
				t.Fatalf("%s: err = %v, want its condition to fail on the retry", tc.op, err)
			}
			if _, ok := r.read(t, "a"); !ok {
				t.Fatalf("the first attempt was not applied")
			}
			if got, want := injectedOf(r), []storetest.Injected{inj(tc.op, 1, 1, storetest.FailAfter)}; !slices.Equal(got, want) {
				t.Fatalf("Injected = %v, want %v", got, want)
			}
		})
	}
}
