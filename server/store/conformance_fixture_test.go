package store_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// t0 is where every fixture's clock starts.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// fixture is one case's store on fresh tables, with an injected clock and a
// token issuer that remembers the hash it gave each worker.
type fixture struct {
	t       *testing.T
	ctx     context.Context
	backend backend
	db      *dynamodb.Client
	prefix  string // of its tables
	tables  store.TableNames
	s       *store.Store
	svc     *control.Service // the use cases over s
	clock   *clock.Fake

	mu     sync.Mutex
	issued int
	hashes map[string]string // worker id → token hash of its latest hello
}

func newFixture(t *testing.T, b backend, db *dynamodb.Client) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("EnsureTables: %v", err)
	}
	c := clock.NewFake(t0)
	s := store.New(db, prefix)
	s.Clock = c.Clock()
	// Ids from the same clock (ULIDs: they sort by it, and by creation
	// order within one millisecond).
	s.IDs = &ids.Generator{Clock: c.Clock()}
	return &fixture{t: t, ctx: ctx, backend: b, db: db, prefix: prefix, tables: s.Tables(), s: s, svc: storetest.Control(s),
		clock: c, hashes: map[string]string{}}
}

// issue is the fixture's store.TokenIssuer.
func (f *fixture) issue(workerID string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.issued++
	h := fmt.Sprintf("hash-%d-%s", f.issued, workerID)
	f.hashes[workerID] = h
	return h, nil
}

func (f *fixture) hash(workerID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hashes[workerID]
}

// submitReq returns a valid submit request for queue q with the defaults
// the API's validation would fill in.
func submitReq(argv ...string) wire.SubmitRequest {
	if len(argv) == 0 {
		argv = []string{"echo", "hi"}
	}
	return wire.SubmitRequest{Queue: "q", Argv: argv, MaxAttempts: wire.DefaultMaxAttempts}
}

func (f *fixture) submit(req wire.SubmitRequest) domain.Invocation {
	f.t.Helper()
	inv, created, err := f.svc.Submit(f.ctx, req.Spec())
	if err != nil {
		f.t.Fatalf("Submit: %v", err)
	}
	if !created {
		f.t.Fatalf("Submit of %v: created = false", req.Argv)
	}
	return inv
}

// submitN submits n invocations to queue, a millisecond apart so their ids
// sort in submit order.
func (f *fixture) submitN(queue string, n int) []domain.Invocation {
	f.t.Helper()
	out := make([]domain.Invocation, 0, n)
	for i := range n {
		req := submitReq("job", fmt.Sprint(i))
		req.Queue = queue
		out = append(out, f.submit(req))
		f.clock.Advance(time.Millisecond)
	}
	return out
}

// helloReq is a hello from machine with boot, serving queue q.
func helloReq(machine, boot string) wire.HelloRequest {
	return wire.HelloRequest{MachineID: machine, BootID: boot, Label: machine, Lanes: []string{"q"}}
}

func (f *fixture) hello(req wire.HelloRequest) control.Registered {
	f.t.Helper()
	res, err := f.svc.Register(f.ctx, req.Registration(), f.issue)
	if err != nil {
		f.t.Fatalf("Hello(%s, %s): %v", req.MachineID, req.BootID, err)
	}
	return res
}

// worker says hello from a new machine and polls once as ready, so the
// worker is active.
func (f *fixture) worker(machine string, hostKey string) domain.Worker {
	f.t.Helper()
	req := helloReq(machine, "boot-1")
	req.HostKey = hostKey
	w := f.hello(req).Worker
	w, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Phase: wire.PhaseReady}.Poll(), nil)
	if err != nil {
		f.t.Fatalf("Heartbeat: %v", err)
	}
	return w
}

func (f *fixture) claim(w domain.Worker, queue string, max int) store.ClaimResult {
	f.t.Helper()
	res, err := f.s.Claim(f.ctx, w, queue, max)
	if err != nil {
		f.t.Fatalf("Claim(%s, %s, %d): %v", w.ID, queue, max, err)
	}
	return res
}

// claimOne claims max 1 and requires that it got exactly want.
func (f *fixture) claimOne(w domain.Worker, want domain.Invocation) domain.Invocation {
	f.t.Helper()
	res := f.claim(w, want.Queue, 1)
	if len(res.Claimed) != 1 || res.Claimed[0].ID != want.ID {
		f.t.Fatalf("claim by %s got %v (%d lost races), want [%s]", w.ID, invIDs(res.Claimed), res.Conflicts, want.ID)
	}
	return res.Claimed[0]
}

// claimNone requires that w can claim nothing from queue.
func (f *fixture) claimNone(w domain.Worker, queue string) {
	f.t.Helper()
	if res := f.claim(w, queue, 10); len(res.Claimed) != 0 {
		f.t.Fatalf("claim by %s got %v, want nothing claimable", w.ID, invIDs(res.Claimed))
	}
}

func (f *fixture) get(id string) domain.Invocation {
	f.t.Helper()
	inv, err := f.s.GetInvocation(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetInvocation(%s): %v", id, err)
	}
	return inv
}

func (f *fixture) getWorker(id string) domain.Worker {
	f.t.Helper()
	w, err := f.s.GetWorker(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetWorker(%s): %v", id, err)
	}
	return w
}

func (f *fixture) ack(w domain.Worker, inv domain.Invocation, attempt int, state domain.InvocationState) (store.AckResult, error) {
	return f.ackAs(f.hash(w.ID), ackReq(w, inv, attempt, state))
}

// authorizeHash is the check a daemon route makes of the acking worker's
// row: its stored token hash must be the presented token's.
func authorizeHash(hash string) store.Authorize {
	return func(w domain.Worker) error {
		if w.TokenHash != hash {
			return wire.Errorf(wire.CodeUnauthorized, "worker token is not valid")
		}
		return nil
	}
}

// ackAs acks req presenting a token whose hash is hash.
func (f *fixture) ackAs(hash string, req wire.AckRequest) (store.AckResult, error) {
	return f.svc.Ack(f.ctx, req.Outcome(), authorizeHash(hash))
}

func ackReq(w domain.Worker, inv domain.Invocation, attempt int, state domain.InvocationState) wire.AckRequest {
	code := 0
	if state != domain.StateSucceeded {
		code = 1
	}
	return wire.AckRequest{WorkerID: w.ID, InvocationID: inv.ID, Attempt: attempt, State: string(state), ExitCode: &code}
}

func (f *fixture) mustAck(w domain.Worker, inv domain.Invocation, attempt int, state domain.InvocationState, recorded bool) store.AckResult {
	f.t.Helper()
	resp, err := f.ack(w, inv, attempt, state)
	if err != nil {
		f.t.Fatalf("Ack(%s attempt %d by %s): %v", inv.ID, attempt, w.ID, err)
	}
	if resp.Recorded != recorded {
		f.t.Fatalf("Ack(%s attempt %d by %s) = %+v, want recorded %v", inv.ID, attempt, w.ID, resp, recorded)
	}
	return resp
}

func (f *fixture) stats(queue string) domain.QueueStats {
	f.t.Helper()
	st, err := f.s.QueueStats(f.ctx, queue)
	if err != nil {
		f.t.Fatalf("QueueStats(%s): %v", queue, err)
	}
	return st
}

// wantStats requires the queue's non-zero state counts to be exactly counts
// and its done_count to be done.
func (f *fixture) wantStats(queue string, counts map[domain.InvocationState]int, done int) {
	f.t.Helper()
	st := f.stats(queue)
	got := map[domain.InvocationState]int{}
	for k, v := range st.Counts {
		if v != 0 {
			got[k] = v
		}
	}
	if !maps.Equal(got, counts) || st.DoneCount != done {
		f.t.Fatalf("QueueStats(%s) = counts %v done %d, want counts %v done %d", queue, got, st.DoneCount, counts, done)
	}
}

func (f *fixture) held(workerID string) []string {
	f.t.Helper()
	invs, err := f.s.Held(f.ctx, workerID)
	if err != nil {
		f.t.Fatalf("Held(%s): %v", workerID, err)
	}
	return invIDs(invs)
}

func invIDs(invs []domain.Invocation) []string {
	out := make([]string, 0, len(invs))
	for _, inv := range invs {
		out = append(out, inv.ID)
	}
	return out
}

// wantCode requires err to carry the wire code of sentinel.
func wantCode(t *testing.T, err error, sentinel *wire.Error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v (code %s), want code %s", err, wire.CodeOf(err), sentinel.Code)
	}
}
