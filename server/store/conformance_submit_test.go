package store_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of submits: a new invocation, an idempotent replay,
// a key reused with another body, a host key, run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"submit/new", testSubmitNew},
		conformanceCase{"submit/idempotent replay", testSubmitReplay},
		conformanceCase{"submit/same key different body", testSubmitKeyConflict},
		conformanceCase{"submit/host key", testSubmitHostKey},
	)
}

func testSubmitNew(t *testing.T, f *fixture) {
	req := submitReq("echo", "hi")
	req.Env = map[string]string{"A": "1"}
	req.TimeoutS = 30
	inv, created, err := f.svc.Submit(f.ctx, req.Spec())
	if err != nil || !created {
		t.Fatalf("Submit = created %v, err %v; want created", created, err)
	}
	if !ids.Valid(ids.Invocation, inv.ID) || inv.State != domain.StateQueued || inv.Attempt != 0 ||
		inv.Version != 1 || inv.HostKey != "" || !inv.CreatedAt.Equal(t0) {
		t.Fatalf("Submit answered %+v", inv)
	}
	got := f.get(inv.ID)
	if got.Queue != "q" || got.State != domain.StateQueued || !slices.Equal(got.Argv, req.Argv) ||
		!maps.Equal(got.Env, req.Env) || got.TimeoutS != 30 || got.MaxAttempts != wire.DefaultMaxAttempts ||
		got.WorkerID != "" || len(got.Attempts) != 0 || !got.CreatedAt.Equal(t0) || got.Version != 1 {
		t.Fatalf("stored %+v", got)
	}
	// Without a key, the same body is a second invocation.
	again := f.submit(req)
	if again.ID == inv.ID {
		t.Fatalf("two submits without a key share id %s", inv.ID)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateQueued: 2}, 0)
}

func testSubmitReplay(t *testing.T, f *fixture) {
	req := submitReq()
	req.IdempotencyKey = "key-1"
	first := f.submit(req)
	f.clock.Advance(time.Minute)
	replay, created, err := f.svc.Submit(f.ctx, req.Spec())
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if created || replay.ID != first.ID || !replay.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("replay = %s created %v at %v, want %s created false at %v",
			replay.ID, created, replay.CreatedAt, first.ID, first.CreatedAt)
	}
	// The replay answers the invocation as it is now, not as submitted.
	w := f.worker("m1", "")
	f.claimOne(w, first)
	replay, _, err = f.svc.Submit(f.ctx, req.Spec())
	if err != nil || replay.State != domain.StateRunning {
		t.Fatalf("replay after claim = %s, %v; want running", replay.State, err)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: 1}, 0)
}

func testSubmitKeyConflict(t *testing.T, f *fixture) {
	req := submitReq("a")
	req.IdempotencyKey = "key-1"
	first := f.submit(req)
	other := submitReq("b")
	other.IdempotencyKey = "key-1"
	_, _, err := f.svc.Submit(f.ctx, other.Spec())
	wantCode(t, err, wire.ErrConflict)
	if !strings.Contains(err.Error(), first.ID) {
		t.Errorf("conflict %q does not name the invocation the key made (%s)", err, first.ID)
	}
	// Another key with the first body is a new invocation.
	req.IdempotencyKey = "key-2"
	if second := f.submit(req); second.ID == first.ID {
		t.Fatal("a new key replayed the old key's invocation")
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateQueued: 2}, 0)
}

func testSubmitHostKey(t *testing.T, f *fixture) {
	req := submitReq()
	req.RunConfig.HostSetup = []string{"apt-get install -y cuda", "nvidia-smi"}
	inv := f.submit(req)
	want := hostkey.Of(req.RunConfig.HostSetup)
	if inv.HostKey != want || f.get(inv.ID).HostKey != want {
		t.Fatalf("host key = %q (stored %q), want %q", inv.HostKey, f.get(inv.ID).HostKey, want)
	}
	if got := f.get(inv.ID).RunConfig.HostSetup; !slices.Equal(got, req.RunConfig.HostSetup) {
		t.Fatalf("stored host_setup %v", got)
	}
}
