package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Blobs is what the artifact use cases ask of the blob store, in domain
// words, for artifact a (or name) of attempt n of invocation id
// (blobs.UseCases adapts a blobs.Store): presign an upload, complete it,
// presign a download. The bytes never pass through here.
type Blobs interface {
	PresignPut(ctx context.Context, id string, n int, a domain.Artifact, ttl time.Duration) (domain.ArtifactUpload, error)
	Complete(ctx context.Context, id string, n int, a domain.Artifact, uploadID string, parts []domain.ArtifactPart) error
	PresignGet(ctx context.Context, id string, n int, name string, ttl time.Duration) (string, error)
}

// How long presigned URLs stay valid: an upload must start within
// UploadTTL of its presign (a long PUT may outlast it), and an operator's
// download within DownloadTTL of its list.
const (
	UploadTTL   = 15 * time.Minute
	DownloadTTL = 10 * time.Minute
)

// ErrNoBlobs answers an artifact use case of a Service built without a
// blob store.
var ErrNoBlobs = errors.New("artifacts are not configured on this control plane (no blob store)")

// ArtifactsEnabled reports whether the Service has a blob store.
func (s *Service) ArtifactsEnabled() bool { return s.blobs != nil }

// PresignArtifact answers where a worker uploads artifact req.Artifact of
// an attempt it holds. The worker must hold the attempt and the attempt
// must still run (domain.Invocation.CheckUpload: 403, 409), within the
// size and count limits; only then is the upload presigned, and recorded
// pending on the attempt with a write that lands only while that still
// holds. A refused request presigns nothing.
func (s *Service) PresignArtifact(ctx context.Context, req domain.ArtifactRequest, auth store.Authorize) (domain.ArtifactUpload, error) {
	if s.blobs == nil {
		return domain.ArtifactUpload{}, ErrNoBlobs
	}
	w, err := s.store.GetWorker(ctx, req.WorkerID)
	if errors.Is(err, domain.ErrNotFound) {
		return domain.ArtifactUpload{}, store.UnknownWorker(req.WorkerID, auth)
	}
	if err != nil {
		return domain.ArtifactUpload{}, fmt.Errorf("presign artifact: %w", err)
	}
	if err := auth(w); err != nil {
		return domain.ArtifactUpload{}, err
	}
	inv, err := s.store.GetInvocation(ctx, req.InvocationID)
	if err != nil {
		return domain.ArtifactUpload{}, err
	}
	a := req.Artifact
	if err := inv.CheckUpload(req.WorkerID, req.Attempt, a, s.artifactLimits); err != nil {
		return domain.ArtifactUpload{}, err
	}
	up, err := s.blobs.PresignPut(ctx, req.InvocationID, req.Attempt, a, UploadTTL)
	if err != nil {
		return domain.ArtifactUpload{}, fmt.Errorf("presign artifact %q of %s: %w", a.Name, req.InvocationID, err)
	}
	a.UploadID = up.UploadID
	if _, err := s.store.ChangeArtifacts(ctx, req.InvocationID, req.WorkerID, auth,
		func(inv domain.Invocation, now time.Time) (domain.Invocation, error) {
			return inv.StartUpload(req.WorkerID, req.Attempt, a, s.artifactLimits, now)
		}); err != nil {
		return domain.ArtifactUpload{}, err
	}
	s.log.Info("artifact upload presigned", "worker_id", req.WorkerID, "invocation_id", req.InvocationID,
		"attempt", req.Attempt, "artifact", a.Name, "size", a.Size)
	return up, nil
}

// CompleteArtifact finishes a worker's upload c and records the artifact
// on its attempt. The attempt must still be held and running, and the
// upload the one its presign recorded pending (domain.Invocation.
// PendingUpload), before the blob store completes it; the record is then
// written only while that still holds (an attempt that ended meanwhile is
// refused and records nothing).
func (s *Service) CompleteArtifact(ctx context.Context, c domain.ArtifactCompletion, auth store.Authorize) (domain.Artifact, error) {
	if s.blobs == nil {
		return domain.Artifact{}, ErrNoBlobs
	}
	var done domain.Artifact
	completed := false
	_, err := s.store.ChangeArtifacts(ctx, c.InvocationID, c.WorkerID, auth,
		func(inv domain.Invocation, now time.Time) (domain.Invocation, error) {
			pending, err := inv.PendingUpload(c.WorkerID, c.Attempt, c.Name, c.UploadID)
			if err != nil {
				return inv, err
			}
			if !completed { // a retried write (the item moved) completes once
				if err := s.blobs.Complete(ctx, c.InvocationID, c.Attempt, pending, c.UploadID, c.Parts); err != nil {
					return inv, domain.Errorf(domain.KindConflict, "artifact %q of %s: its upload is not complete: %v", c.Name, c.InvocationID, err)
				}
				completed = true
			}
			next, a, err := inv.CompleteUpload(c.WorkerID, c.Attempt, c.Name, c.UploadID, now)
			done = a
			return next, err
		})
	if err != nil {
		return domain.Artifact{}, err
	}
	s.log.Info("artifact recorded", "worker_id", c.WorkerID, "invocation_id", c.InvocationID,
		"attempt", c.Attempt, "artifact", c.Name, "size", done.Size)
	return done, nil
}

// ListedArtifact is one recorded artifact as an operator sees it: of
// which attempt, whether that attempt's outcome is the invocation's
// (Counted), how the attempt ended otherwise, and a presigned GET.
type ListedArtifact struct {
	domain.Artifact
	InvocationID string
	Attempt      int
	Counted      bool
	// AttemptOutcome is how its attempt ended ("": it still runs).
	AttemptOutcome string
	URL            string
	// RunIndex is its job's index, in a run's list.
	RunIndex int
}

// InvocationArtifacts lists every artifact of every attempt of
// invocation id, attempt by attempt, each with a GET valid DownloadTTL.
// Only the counted attempt's (domain.Invocation.CountedAttempt) are
// Counted: an artifact of an attempt superseded, handed back or taken
// back never passes for the invocation's.
func (s *Service) InvocationArtifacts(ctx context.Context, id string) ([]ListedArtifact, error) {
	if s.blobs == nil {
		return nil, ErrNoBlobs
	}
	inv, err := s.store.GetInvocation(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.listArtifacts(ctx, inv)
}

// RunArtifacts lists the artifacts of jobs [from, from+n) of run id, in
// index order (InvocationArtifacts of each), and the index of the next
// page's first job (0: this page reached the run's end). A page costs a
// read of the run and one of its n jobs, whatever the run's size.
func (s *Service) RunArtifacts(ctx context.Context, id string, from, n int) ([]ListedArtifact, int, error) {
	if s.blobs == nil {
		return nil, 0, ErrNoBlobs
	}
	run, jobs, err := s.RunJobs(ctx, id, from, n)
	if err != nil {
		return nil, 0, err
	}
	out := []ListedArtifact{}
	for _, inv := range jobs {
		listed, err := s.listArtifacts(ctx, inv)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, listed...)
	}
	next := 0
	if end := from + n; end < run.Total {
		next = end
	}
	return out, next, nil
}

// listArtifacts lists inv's artifacts (InvocationArtifacts).
func (s *Service) listArtifacts(ctx context.Context, inv domain.Invocation) ([]ListedArtifact, error) {
	counted := inv.CountedAttempt()
	out := []ListedArtifact{}
	for _, at := range inv.Attempts {
		for _, a := range at.Published() {
			url, err := s.blobs.PresignGet(ctx, inv.ID, at.Attempt, a.Name, DownloadTTL)
			if err != nil {
				return nil, fmt.Errorf("presign the download of %q of %s: %w", a.Name, inv.ID, err)
			}
			l := ListedArtifact{Artifact: a, InvocationID: inv.ID, Attempt: at.Attempt, Counted: at.Attempt == counted,
				URL: url, RunIndex: inv.RunIndex}
			if !l.Counted {
				l.AttemptOutcome = at.Outcome
			}
			out = append(out, l)
		}
	}
	return out, nil
}
