package store_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestLifecycleWriteUnits bills one invocation's life (submit, claim, ack)
// in DynamoDB write units (storetest.Meter) and holds the invocations
// table's indexes to what docs/cost.md models: the queue index is written
// once, at the submit (its key never changes, and it projects only keys);
// the queue_state index's entries stay under 1 KB however large the item
// (a transition deletes one and puts one); and a life of a small
// invocation acked by another process than the one that claimed (as on
// Lambda) costs 16 write units in all (BenchmarkLifecycle reports them):
// the worker's token is checked by the ack's read of its row, which costs
// no write unit.
func TestLifecycleWriteUnits(t *testing.T) {
	for _, c := range []struct {
		name  string
		tails bool
		total float64
	}{
		// 16, and 2 for noting the queue at its first submit from this
		// process: its listing entry's put and that index's entry.
		{name: "small", total: 18},
		// The ack stores 8 KiB of output tails: the table pays for the big
		// item (9 KB, twice in the ack's transaction), the indexes do not.
		{name: "output-tails", tails: true, total: 34},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s, _, meter := benchMeteredStore(t)
			svc := storetest.Control(s)
			// The ack reaches another process than the claim, as on Lambda.
			acker := storetest.Control(store.New(s.DB(), prefixOf(s)))
			w := benchWorker(t, s, "machine-1", "")
			meter.Reset()

			inv, _, err := svc.Submit(ctx, submitReq("job").Spec())
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			res, err := s.Claim(ctx, w, "q", 1)
			if err != nil || len(res.Claimed) != 1 {
				t.Fatalf("Claim = %v, %v", invIDs(res.Claimed), err)
			}
			ack := ackReq(w, inv, 1, domain.StateSucceeded)
			if c.tails {
				ack.StdoutTail = strings.Repeat("o", wire.MaxTailBytes)
				ack.StderrTail = strings.Repeat("e", wire.MaxTailBytes)
			}
			if resp, err := acker.Ack(ctx, ack.Outcome(), authorizeHash("bench-hash")); err != nil || !resp.Recorded {
				t.Fatalf("Ack = %+v, %v", resp, err)
			}

			units := meter.Snapshot()
			if got := units["invocations/queue"].Write; got != 1 {
				t.Errorf("queue index: %v write units, want 1 (the submit's put only)", got)
			}
			// Submit: a put; claim and ack: a delete and a put each.
			if got := units["invocations/queue_state"].Write; got != 5 {
				t.Errorf("queue_state index: %v write units, want 5 (entries under 1 KB)", got)
			}
			if got := meter.Total().Write; got != c.total {
				t.Errorf("life: %v write units, want %v (by table and index: %v)", got, c.total, units)
			}
		})
	}
}

// TestArtifactWriteUnits: publishing an artifact rewrites the running
// invocation (one versioned put; the worker's token is checked by the
// read before it) and its holder index entry, and no listing index: they
// do not project the attempts' artifacts.
func TestArtifactWriteUnits(t *testing.T) {
	ctx := context.Background()
	s, _, meter := benchMeteredStore(t)
	svc := storetest.Control(s)
	w := benchWorker(t, s, "machine-1", "")
	inv, _, err := svc.Submit(ctx, submitReq("job").Spec())
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if res, err := s.Claim(ctx, w, "q", 1); err != nil || len(res.Claimed) != 1 {
		t.Fatalf("Claim = %v, %v", invIDs(res.Claimed), err)
	}
	meter.Reset()
	a := domain.Artifact{Name: "predictions.json", Size: 2 << 20, SHA256: strings.Repeat("ab", 32), UploadID: "upload-1"}
	_, err = s.ChangeArtifacts(ctx, inv.ID, w.ID, authorizeHash("bench-hash"),
		func(cur domain.Invocation, now time.Time) (domain.Invocation, error) {
			return cur.StartUpload(w.ID, 1, a, domain.ArtifactLimits{}, now)
		})
	if err != nil {
		t.Fatalf("ChangeArtifacts: %v", err)
	}
	got := map[string]float64{}
	for name, u := range meter.Snapshot() {
		if u.Write > 0 {
			got[name] = u.Write
		}
	}
	// The invocation once: no transaction, and nothing written to the
	// worker's row.
	if want := map[string]float64{"invocations": 1, "invocations/holder": 1}; !maps.Equal(got, want) {
		t.Fatalf("write units by table and index = %v, want %v", got, want)
	}
}
