package domain

import (
	"testing"
	"time"
)

// publishing is an invocation running attempt 2 on worker "b", after
// attempt 1 on "a" was handed back; attempt 2 has published "x".
func publishing() Invocation {
	return Invocation{ID: "inv", State: StateRunning, Attempt: 2, MaxAttempts: 3, WorkerID: "b", Attempts: []Attempt{
		{Attempt: 1, WorkerID: "a", Outcome: string(EndRequeued), EndedAt: t0},
		{Attempt: 2, WorkerID: "b", Artifacts: []Artifact{{Name: "x", Size: 1}}},
	}}
}

// TestArtifactUploadRules: only the worker that runs an attempt, while it
// runs, may upload into it, within the size and count limits; a name
// already recorded replaces and does not count twice.
func TestArtifactUploadRules(t *testing.T) {
	limits := ArtifactLimits{MaxBytes: 10, MaxPerAttempt: 2}
	ended := publishing()
	ended.State, ended.WorkerID = StateSucceeded, "b"
	ended.Attempts[1].Outcome, ended.Attempts[1].Recorded = "succeeded", true
	superseded := publishing()
	superseded.Attempts[1].Outcome = string(EndSuperseded)
	full := publishing()
	full.Attempts[1].Artifacts = append(full.Attempts[1].Artifacts, Artifact{Name: "y"})
	for _, c := range []struct {
		name   string
		inv    Invocation
		worker string
		n      int
		a      Artifact
		want   Kind
	}{
		{"the holder", publishing(), "b", 2, Artifact{Name: "y", Size: 10}, 0},
		{"another worker", publishing(), "a", 2, Artifact{Name: "y"}, KindForbidden},
		{"an attempt not run", publishing(), "b", 3, Artifact{Name: "y"}, KindForbidden},
		{"a handed-back attempt", publishing(), "a", 1, Artifact{Name: "y"}, KindConflict},
		{"an attempt whose outcome is recorded", ended, "b", 2, Artifact{Name: "y"}, KindConflict},
		{"a superseded attempt", superseded, "b", 2, Artifact{Name: "y"}, KindConflict},
		{"past the size limit", publishing(), "b", 2, Artifact{Name: "y", Size: 11}, KindInvalid},
		{"past the count limit", full, "b", 2, Artifact{Name: "z"}, KindConflict},
		{"a name again at the count limit", full, "b", 2, Artifact{Name: "x"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			next, err := c.inv.StartUpload(c.worker, c.n, c.a, limits, t0)
			if KindOf(err) != c.want {
				t.Fatalf("StartUpload: %v, want kind %d", err, c.want)
			}
			if err != nil {
				return
			}
			at := next.Attempts[1]
			if i := at.artifactIndex(c.a.Name); i < 0 || !at.Artifacts[i].Pending {
				t.Errorf("no pending record of %q: %+v", c.a.Name, at.Artifacts)
			}
			if len(c.inv.Attempts[1].Artifacts) == len(at.Artifacts) && c.inv.Attempts[1].artifactIndex(c.a.Name) < 0 {
				t.Errorf("a new name was not added")
			}
		})
	}
}

// TestArtifactCompleteReplaces: completing the pending upload records it
// (no longer pending, listed by Published) in place of the earlier record
// of its name; another upload id, or an attempt that ended meanwhile, is
// refused.
func TestArtifactCompleteReplaces(t *testing.T) {
	inv := publishing()
	inv.Attempts[1].Artifacts[0].CreatedAt = t0
	started, err := inv.StartUpload("b", 2, Artifact{Name: "x", Size: 5, SHA256: "new", UploadID: "u2"}, ArtifactLimits{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := started.Attempts[1].Published(); len(got) != 0 {
		t.Errorf("while the new upload is pending, %+v is listed", got)
	}
	if len(inv.Attempts[1].Artifacts) != 1 || inv.Attempts[1].Artifacts[0].Pending {
		t.Errorf("StartUpload changed its receiver")
	}
	if _, _, err := started.CompleteUpload("b", 2, "x", "u1", t0); KindOf(err) != KindConflict {
		t.Errorf("another upload id: %v, want a conflict", err)
	}
	handedBack, _ := started.Requeue("b", Loss{Kind: EndRequeued}, t0)
	if _, _, err := handedBack.CompleteUpload("b", 2, "x", "u2", t0); KindOf(err) != KindConflict {
		t.Errorf("after the attempt was handed back: %v, want a conflict", err)
	}
	done, a, err := started.CompleteUpload("b", 2, "x", "u2", t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := done.Attempts[1].Published()
	if len(got) != 1 || got[0] != a || a.SHA256 != "new" || a.Size != 5 || a.UploadID != "" || !a.CreatedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("recorded %+v, listed %+v", a, got)
	}
}
