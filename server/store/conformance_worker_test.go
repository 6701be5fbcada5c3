package store_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of a worker's life: hello, heartbeat, bye and drain,
// run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"hello/retried hello same worker", testHelloRetry},
		conformanceCase{"hello/new boot retires old worker", testHelloNewBoot},
		conformanceCase{"hello/after gone makes a new worker", testHelloAfterGone},
		conformanceCase{"hello/never polled expires", testHelloNeverPolledExpires},
		conformanceCase{"heartbeat/phase projection", testHeartbeatProjection},
		conformanceCase{"heartbeat/gone worker", testHeartbeatGone},
		conformanceCase{"heartbeat/authorize refusal", testHeartbeatAuthorize},
		conformanceCase{"bye/gone and requeued", testBye},
		conformanceCase{"drain", testDrain},
	)
}

// testHelloNeverPolledExpires: a worker that said hello carries a TTL an
// hour after it, so hello floods do not grow the table for ever; its first
// poll removes it; a hello of the same boot after the row went makes a new
// worker.
func testHelloNeverPolledExpires(t *testing.T, f *fixture) {
	expiresAt := func(id string) (int64, bool) {
		t.Helper()
		out, err := f.db.GetItem(f.ctx, &dynamodb.GetItemInput{TableName: aws.String(f.tables.Workers),
			Key: map[string]types.AttributeValue{"worker_id": &types.AttributeValueMemberS{Value: id}}, ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := out.Item["expires_at"].(*types.AttributeValueMemberN)
		if !ok {
			return 0, false
		}
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n, true
	}
	w := f.hello(helloReq("m-flood", "b1")).Worker
	if exp, ok := expiresAt(w.ID); !ok || exp != f.clock.Now().Add(domain.DefaultNeverPolledRetention).Unix() {
		t.Fatalf("a worker that only said hello: expires_at %d (%v), want an hour on", exp, ok)
	}
	if _, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Phase: wire.PhaseSetup}.Poll(), nil); err != nil {
		t.Fatal(err)
	}
	if exp, ok := expiresAt(w.ID); ok {
		t.Fatalf("after its first poll the worker still expires at %d", exp)
	}
	// Its row gone (as TTL deletes it), a retried hello of the same boot
	// makes a new worker.
	gone := f.hello(helloReq("m-gone", "b1")).Worker
	if _, err := f.db.DeleteItem(f.ctx, &dynamodb.DeleteItemInput{TableName: aws.String(f.tables.Workers),
		Key: map[string]types.AttributeValue{"worker_id": &types.AttributeValueMemberS{Value: gone.ID}}}); err != nil {
		t.Fatal(err)
	}
	if again := f.hello(helloReq("m-gone", "b1")).Worker; again.ID == gone.ID {
		t.Fatalf("a hello after the row expired answered the expired worker %s", gone.ID)
	}
}

func testHelloRetry(t *testing.T, f *fixture) {
	req := helloReq("m1", "boot-1")
	two := 2
	req.Capabilities.MaxConcurrency = &two
	req.Tags = map[string]string{"zone": "a"}
	first := f.hello(req)
	w := first.Worker
	if !ids.Valid(ids.Worker, w.ID) || w.State != domain.WorkerJoining || w.MaxConcurrency != 2 ||
		w.MachineID != "m1" || w.BootID != "boot-1" || first.Retired != "" {
		t.Fatalf("first hello: %+v", first)
	}
	firstHash := f.hash(w.ID)
	f.clock.Advance(time.Second)
	second := f.hello(req)
	if second.Worker.ID != w.ID || second.Retired != "" || second.Requeued != 0 {
		t.Fatalf("retried hello = %+v, want worker %s", second, w.ID)
	}
	stored := f.getWorker(w.ID)
	if stored.TokenHash == firstHash || stored.TokenHash != f.hash(w.ID) || !stored.LastSeenAt.Equal(f.clock.Now()) ||
		stored.Tags["zone"] != "a" {
		t.Fatalf("after retried hello: %+v", stored)
	}
	ws, _, err := f.s.ListWorkers(f.ctx, 10, "")
	if err != nil || len(ws) != 1 {
		t.Fatalf("ListWorkers = %d rows, %v; want 1", len(ws), err)
	}
	// Without capabilities a worker runs one invocation at a time.
	if w := f.hello(helloReq("m2", "boot-1")).Worker; w.MaxConcurrency != 1 {
		t.Fatalf("default max_concurrency = %d, want 1", w.MaxConcurrency)
	}
}

func testHelloNewBoot(t *testing.T, f *fixture) {
	req := helloReq("m1", "boot-1")
	two := 2
	req.Capabilities.MaxConcurrency = &two
	old := f.hello(req).Worker
	if _, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: old.ID, Phase: wire.PhaseReady}.Poll(), nil); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	subs := f.submitN("q", 2)
	if res := f.claim(old, "q", 2); len(res.Claimed) != 2 {
		t.Fatalf("old worker claimed %d, want 2", len(res.Claimed))
	}

	req.BootID = "boot-2"
	res := f.hello(req)
	if res.Worker.ID == old.ID || res.Retired != old.ID || res.Requeued != 2 {
		t.Fatalf("hello from a new boot = worker %s retired %q requeued %d; want new worker, retired %s, 2 requeued",
			res.Worker.ID, res.Retired, res.Requeued, old.ID)
	}
	if g := f.getWorker(old.ID); g.State != domain.WorkerGone || g.GoneAt.IsZero() {
		t.Fatalf("old worker: state %s gone_at %v", g.State, g.GoneAt)
	}
	for _, inv := range subs {
		if got := f.get(inv.ID); got.State != domain.StateQueued || got.WorkerID != "" {
			t.Fatalf("%s after new boot: %s by %q", inv.ID, got.State, got.WorkerID)
		}
	}
	if h := f.held(old.ID); len(h) != 0 {
		t.Fatalf("Held(old) = %v", h)
	}
	// The old process's poll is refused; the new worker gets the work back.
	_, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: old.ID}.Poll(), nil)
	wantCode(t, err, wire.ErrWorkerGone)
	again := f.claim(res.Worker, "q", 2)
	if len(again.Claimed) != 2 || again.Claimed[0].Attempt != 2 || again.Claimed[1].Attempt != 2 {
		t.Fatalf("reclaim: %+v", again.Claimed)
	}
}

func testHelloAfterGone(t *testing.T, f *fixture) {
	w := f.hello(helloReq("m1", "boot-1")).Worker
	if _, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: w.ID, Reason: wire.ByeIdle}.Bye(), nil); err != nil {
		t.Fatalf("Bye: %v", err)
	}
	res := f.hello(helloReq("m1", "boot-1"))
	if res.Worker.ID == w.ID {
		t.Fatalf("hello after gone revived worker %s", w.ID)
	}
	if g := f.getWorker(w.ID); g.State != domain.WorkerGone {
		t.Fatalf("old worker state %s, want gone", g.State)
	}
	if _, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: res.Worker.ID}.Poll(), nil); err != nil {
		t.Fatalf("Heartbeat of the new worker: %v", err)
	}
	// And the machine now maps to the new worker: a retried hello finds it.
	if again := f.hello(helloReq("m1", "boot-1")); again.Worker.ID != res.Worker.ID {
		t.Fatalf("retried hello = %s, want %s", again.Worker.ID, res.Worker.ID)
	}
}

func testHeartbeatProjection(t *testing.T, f *fixture) {
	w := f.hello(helloReq("m1", "boot-1")).Worker
	// A phase the daemon never sends is refused (before any write).
	_, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Phase: wire.PhaseBooting}.Poll(), nil)
	wantCode(t, err, wire.ErrInvalid)
	if got := f.getWorker(w.ID); got.Version != w.Version {
		t.Fatalf("a refused poll wrote the worker")
	}
	steps := []struct {
		phase string
		want  domain.WorkerState
	}{
		{"", domain.WorkerActive}, // an old daemon: joining → active
		{wire.PhaseSetup, domain.WorkerSettingUp},
		{"", domain.WorkerSettingUp},
		{wire.PhaseReady, domain.WorkerActive},
		{wire.PhaseDraining, domain.WorkerDraining},
		{wire.PhaseReady, domain.WorkerDraining}, // never widened
		{wire.PhaseTerminating, domain.WorkerDraining},
	}
	for i, s := range steps {
		f.clock.Advance(time.Second)
		got, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Phase: s.phase, Invocations: []string{"inv_a", "inv_b"}}.Poll(), nil)
		if err != nil {
			t.Fatalf("step %d: Heartbeat(phase %q): %v", i, s.phase, err)
		}
		stored := f.getWorker(w.ID)
		if got.State != s.want || stored.State != s.want || stored.Phase != domain.Phase(s.phase) || !stored.LastSeenAt.Equal(f.clock.Now()) {
			t.Fatalf("step %d: phase %q → state %s (stored %s, phase %q, last seen %v), want %s",
				i, s.phase, got.State, stored.State, stored.Phase, stored.LastSeenAt, s.want)
		}
		if stored.CurrentInvocations != 2 {
			t.Fatalf("step %d: current_invocations %d, want 2 (the poll's list)", i, stored.CurrentInvocations)
		}
	}
	// Capabilities and the host key are recorded.
	four, one := 4, 1
	_, err = f.svc.Heartbeat(f.ctx, wire.PollRequest{
		WorkerID: w.ID, HostKey: "hk1_x",
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: &four, CurrentInvocations: &one},
	}.Poll(), nil)
	if err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	stored := f.getWorker(w.ID)
	if stored.MaxConcurrency != 4 || stored.CurrentInvocations != 1 || stored.HostKey != "hk1_x" {
		t.Fatalf("after heartbeat with capabilities: %+v", stored)
	}
	// A poll for a queue outside the lanes of the worker's hello is refused.
	_, err = f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Queue: "not-a-lane"}.Poll(), nil)
	wantCode(t, err, wire.ErrInvalid)
	if after := f.getWorker(w.ID); after.Version != stored.Version {
		t.Fatal("a refused poll wrote the worker")
	}
	if _, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Queue: "q"}.Poll(), nil); err != nil {
		t.Fatalf("poll for its lane: %v", err)
	}
}

func testHeartbeatGone(t *testing.T, f *fixture) {
	w := f.worker("m1", "")
	if _, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: w.ID, Reason: wire.ByeSignal}.Bye(), nil); err != nil {
		t.Fatalf("Bye: %v", err)
	}
	for _, phase := range []string{"", wire.PhaseReady, wire.PhaseSetup} {
		_, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Phase: phase}.Poll(), nil)
		wantCode(t, err, wire.ErrWorkerGone)
	}
	if g := f.getWorker(w.ID); g.State != domain.WorkerGone {
		t.Fatalf("a poll revived the worker: %s", g.State)
	}
	_, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: "wrk_missing"}.Poll(), nil)
	wantCode(t, err, wire.ErrNotFound)
}

func testHeartbeatAuthorize(t *testing.T, f *fixture) {
	w := f.worker("m1", "")
	before := f.getWorker(w.ID)
	var saw domain.Worker
	deny := func(w domain.Worker) error {
		saw = w
		return wire.Errorf(wire.CodeUnauthorized, "bad token")
	}
	_, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Phase: wire.PhaseDraining}.Poll(), deny)
	wantCode(t, err, wire.ErrUnauthorized)
	if saw.ID != w.ID || saw.TokenHash != f.hash(w.ID) {
		t.Fatalf("Authorize saw %+v", saw)
	}
	_, err = f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: w.ID, Reason: wire.ByeIdle}.Bye(), deny)
	wantCode(t, err, wire.ErrUnauthorized)
	if after := f.getWorker(w.ID); after.Version != before.Version || after.State != domain.WorkerActive {
		t.Fatalf("a refused poll or bye wrote the worker: version %d → %d, state %s", before.Version, after.Version, after.State)
	}
}

func testBye(t *testing.T, f *fixture) {
	req := helloReq("m1", "boot-1")
	two := 2
	req.Capabilities.MaxConcurrency = &two
	w := f.hello(req).Worker
	subs := f.submitN("q", 2)
	if res := f.claim(w, "q", 2); len(res.Claimed) != 2 {
		t.Fatalf("claimed %d, want 2", len(res.Claimed))
	}
	f.clock.Advance(time.Second)
	n, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: w.ID, Reason: wire.ByeDrain, InflightAbandoned: 2}.Bye(), nil)
	if err != nil || n != 2 {
		t.Fatalf("Bye = %d, %v; want 2 requeued", n, err)
	}
	g := f.getWorker(w.ID)
	if g.State != domain.WorkerGone || !g.GoneAt.Equal(f.clock.Now()) || !strings.Contains(g.GoneWhy, wire.ByeDrain) ||
		g.CurrentInvocations != 0 {
		t.Fatalf("after bye: state %s gone_at %v reason %q current_invocations %d", g.State, g.GoneAt, g.GoneWhy, g.CurrentInvocations)
	}
	if h := f.held(w.ID); len(h) != 0 {
		t.Fatalf("Held after bye = %v", h)
	}
	for _, inv := range subs {
		if got := f.get(inv.ID); got.State != domain.StateQueued {
			t.Fatalf("%s after bye: %s", inv.ID, got.State)
		}
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateQueued: 2}, 0)
	// A repeated bye changes nothing.
	if n, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: w.ID, Reason: wire.ByeIdle}.Bye(), nil); err != nil || n != 0 {
		t.Fatalf("second Bye = %d, %v", n, err)
	}
	if g := f.getWorker(w.ID); !strings.Contains(g.GoneWhy, wire.ByeDrain) {
		t.Fatalf("second bye rewrote the reason: %q", g.GoneWhy)
	}
}

func testDrain(t *testing.T, f *fixture) {
	w := f.worker("m1", "")
	for range 2 { // draining a draining worker is a no-op
		got, err := f.s.RequestDrain(f.ctx, w.ID)
		if err != nil || got.State != domain.WorkerDraining {
			t.Fatalf("RequestDrain = %s, %v", got.State, err)
		}
	}
	if got, err := f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: w.ID, Phase: wire.PhaseReady}.Poll(), nil); err != nil || got.State != domain.WorkerDraining {
		t.Fatalf("a ready poll after drain = %s, %v; want draining", got.State, err)
	}
	if ok, _ := domain.AcceptsWork(f.getWorker(w.ID), false); ok {
		t.Fatal("a draining worker accepts work")
	}
	if _, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: w.ID, Reason: wire.ByeDrain}.Bye(), nil); err != nil {
		t.Fatalf("Bye: %v", err)
	}
	_, err := f.s.RequestDrain(f.ctx, w.ID)
	wantCode(t, err, wire.ErrConflict)
	_, err = f.s.RequestDrain(f.ctx, "wrk_missing")
	wantCode(t, err, wire.ErrNotFound)
}
