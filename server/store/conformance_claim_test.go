package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/hostkey"
)

// The conformance cases of claims: queued to running, up to max, host keys
// matched, run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"claim/queued to running", testClaimQueuedToRunning},
		conformanceCase{"claim/up to max", testClaimUpToMax},
		conformanceCase{"claim/host key matching", testClaimHostKey},
	)
}

func testClaimQueuedToRunning(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	w := f.worker("m1", "")
	f.clock.Advance(time.Second)
	now := f.clock.Now()
	res := f.claim(w, "q", 1)
	if len(res.Claimed) != 1 || res.Conflicts != 0 {
		t.Fatalf("Claim = %d claimed, %d conflicts; want 1, 0", len(res.Claimed), res.Conflicts)
	}
	for _, got := range []domain.Invocation{res.Claimed[0], f.get(inv.ID)} {
		if got.ID != inv.ID || got.State != domain.StateRunning || got.Attempt != 1 || got.WorkerID != w.ID ||
			!got.StartedAt.Equal(now) || got.Version != 2 {
			t.Fatalf("claimed %+v", got)
		}
		if len(got.Attempts) != 1 || got.Attempts[0].Attempt != 1 || got.Attempts[0].WorkerID != w.ID ||
			!got.Attempts[0].ClaimedAt.Equal(now) {
			t.Fatalf("attempts %+v", got.Attempts)
		}
	}
	if got := f.held(w.ID); !slices.Equal(got, []string{inv.ID}) {
		t.Fatalf("Held = %v, want [%s]", got, inv.ID)
	}
	// The claim index drops a claimed item (its claim_key goes with the
	// whole-item put; an UpdateExpression REMOVE would leave it on minidyn):
	// nobody can claim it again.
	f.claimNone(w, "q")
	f.claimNone(f.worker("m2", ""), "q")
	f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: 1}, 0)
}

func testClaimUpToMax(t *testing.T, f *fixture) {
	subs := f.submitN("q", 5)
	w := f.worker("m1", "")
	first := f.claim(w, "q", 3)
	second := f.claim(w, "q", 3)
	if len(first.Claimed) != 3 || len(second.Claimed) != 2 {
		t.Fatalf("claims of max 3 got %d then %d, want 3 then 2", len(first.Claimed), len(second.Claimed))
	}
	got := append(invIDs(first.Claimed), invIDs(second.Claimed)...)
	slices.Sort(got)
	if !slices.Equal(got, invIDs(subs)) {
		t.Fatalf("claimed %v, want %v", got, invIDs(subs))
	}
	f.claimNone(w, "q")
	// Another queue's work is not claimed.
	other := submitReq()
	other.Queue = "other"
	f.submit(other)
	f.claimNone(w, "q")
}

func testClaimHostKey(t *testing.T, f *fixture) {
	setup := []string{"install gpu driver"}
	key := hostkey.Of(setup)
	keyedReq := submitReq("keyed")
	keyedReq.RunConfig.HostSetup = setup
	keyed := f.submit(keyedReq)
	f.clock.Advance(time.Millisecond)
	plain := f.submit(submitReq("plain"))

	anyHost := f.worker("m-plain", "")
	otherHost := f.worker("m-other", hostkey.Of([]string{"something else"}))
	gpuHost := f.worker("m-gpu", key)

	// A worker without a host key gets only work without one.
	if res := f.claim(anyHost, "q", 10); !slices.Equal(invIDs(res.Claimed), []string{plain.ID}) {
		t.Fatalf("worker without host key claimed %v, want only %s", invIDs(res.Claimed), plain.ID)
	}
	// Keyed work goes to no other key.
	f.claimNone(otherHost, "q")
	f.claimNone(anyHost, "q")
	if res := f.claim(gpuHost, "q", 10); !slices.Equal(invIDs(res.Claimed), []string{keyed.ID}) {
		t.Fatalf("worker with the key claimed %v, want %s", invIDs(res.Claimed), keyed.ID)
	}

	// A keyed worker takes its own key's work first, then anyone's.
	plain2 := f.submit(submitReq("plain2"))
	f.clock.Advance(time.Millisecond)
	keyed2 := f.submit(keyedReq)
	f.claimOne(gpuHost, keyed2)
	f.claimOne(gpuHost, plain2)
	f.claimNone(gpuHost, "q")
}
