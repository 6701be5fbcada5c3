package domain

import (
	"slices"
	"time"
)

// Artifact is one file a body published, recorded on the attempt that
// published it (docs/artifacts.md). Its bytes live in the blob store under
// its invocation, attempt and name; the record is what lets an operator
// tell the counted attempt's artifacts from those of attempts that were
// superseded or handed back.
//
// A record is Pending from the moment its upload was presigned until the
// upload is completed: a pending record is listed nowhere, names the one
// upload (UploadID) whose completion may finish it, and holds its place
// in the attempt's count. A name published again by the same attempt
// replaces the earlier record from its presign on: the bytes go to the
// same key, so the earlier content is gone once the new upload lands.
type Artifact struct {
	Name        string
	Size        int64
	SHA256      string // lower-case hex
	ContentType string
	// CreatedAt is when its upload was completed (while pending: presigned).
	CreatedAt time.Time
	Pending   bool
	UploadID  string
}

// ArtifactLimits bound what one attempt may publish: MaxBytes per
// artifact, MaxPerAttempt distinct names per attempt.
type ArtifactLimits struct {
	MaxBytes      int64
	MaxPerAttempt int
}

// Default artifact limits (a deploy may lower them).
const (
	// DefaultMaxArtifactBytes: 5 GiB, S3's largest single PUT.
	DefaultMaxArtifactBytes int64 = 5 << 30
	// DefaultMaxArtifactsPerAttempt bounds the names of one attempt.
	DefaultMaxArtifactsPerAttempt = 100
)

// OrDefault reports l with its unset (zero or negative) limits at their
// defaults.
func (l ArtifactLimits) OrDefault() ArtifactLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxArtifactBytes
	}
	if l.MaxPerAttempt <= 0 {
		l.MaxPerAttempt = DefaultMaxArtifactsPerAttempt
	}
	return l
}

// ArtifactUpload is where the bytes of one artifact go, as a blob store
// presigned it: one PUT of the whole content to URL with Headers, or,
// past the multipart threshold, a PUT of each part (PartSize bytes each,
// the last shorter) to its URL.
type ArtifactUpload struct {
	UploadID  string
	Method    string
	URL       string
	Headers   map[string]string
	PartSize  int64
	Parts     []ArtifactPart
	ExpiresAt time.Time
}

// ArtifactPart is one part of a multipart upload: its number (from 1),
// its presigned URL, and, when it is completed, the ETag its PUT answered.
type ArtifactPart struct {
	Number int
	URL    string
	ETag   string
}

// ArtifactRequest is a worker's ask to upload one artifact of an attempt
// it holds.
type ArtifactRequest struct {
	WorkerID     string
	InvocationID string
	Attempt      int
	Artifact     Artifact
}

// ArtifactCompletion is a worker's word that the upload UploadID of
// artifact Name of its attempt is done.
type ArtifactCompletion struct {
	WorkerID     string
	InvocationID string
	Attempt      int
	Name         string
	UploadID     string
	Parts        []ArtifactPart
}

// PublishingAttempt reports whether worker may publish into attempt n of
// inv: it must be the worker that ran attempt n (forbidden otherwise), and
// the attempt must still be running there (a conflict once it ended: an
// outcome recorded, handed back, taken back or superseded), so nothing a
// stale or superseded attempt publishes ever lands on the invocation.
func (inv Invocation) PublishingAttempt(workerID string, n int) (*Attempt, error) {
	if !inv.HeldBy(workerID, n) {
		return nil, refuse(KindForbidden, "attempt %d of %s is not held by worker %s", n, inv.ID, workerID)
	}
	a := &inv.Attempts[inv.attemptIndex(n)]
	if !inv.Running(workerID) || inv.Attempt != n || a.Outcome != "" {
		how := a.Outcome
		if how == "" {
			how = string(inv.State)
		}
		return nil, refuse(KindConflict, "attempt %d of %s has ended (%s): it publishes no more artifacts", n, inv.ID, how)
	}
	return a, nil
}

// CheckUpload reports whether worker may upload artifact a into attempt n
// of inv within limits: a publishing attempt (PublishingAttempt), a size
// within MaxBytes, and a name already recorded or room for one more.
func (inv Invocation) CheckUpload(workerID string, n int, a Artifact, limits ArtifactLimits) error {
	at, err := inv.PublishingAttempt(workerID, n)
	if err != nil {
		return err
	}
	limits = limits.OrDefault()
	if a.Size > limits.MaxBytes {
		return refuse(KindInvalid, "artifact %q is %d bytes; at most %d per artifact", a.Name, a.Size, limits.MaxBytes)
	}
	if at.artifactIndex(a.Name) < 0 && len(at.Artifacts) >= limits.MaxPerAttempt {
		return refuse(KindConflict, "attempt %d of %s has %d artifacts; at most %d per attempt (publishing a name again replaces it)",
			n, inv.ID, len(at.Artifacts), limits.MaxPerAttempt)
	}
	return nil
}

// StartUpload reports inv with artifact a pending on attempt n of worker
// (CheckUpload first), replacing a record of the same name: a is the
// upload the blob store presigned (UploadID), asked at now.
func (inv Invocation) StartUpload(workerID string, n int, a Artifact, limits ArtifactLimits, now time.Time) (Invocation, error) {
	if err := inv.CheckUpload(workerID, n, a, limits); err != nil {
		return inv, err
	}
	a.Pending, a.CreatedAt = true, now
	return inv.withArtifact(n, a), nil
}

// PendingUpload reports the pending record of artifact name on attempt n
// of worker, which upload uploadID must be: an upload the control plane
// did not presign, or one a later publish of the name replaced, is a
// conflict.
func (inv Invocation) PendingUpload(workerID string, n int, name, uploadID string) (Artifact, error) {
	at, err := inv.PublishingAttempt(workerID, n)
	if err != nil {
		return Artifact{}, err
	}
	i := at.artifactIndex(name)
	if i < 0 || !at.Artifacts[i].Pending || at.Artifacts[i].UploadID != uploadID {
		return Artifact{}, refuse(KindConflict, "artifact %q of attempt %d of %s has no pending upload %s (ask for an upload first; a later publish of the name replaces an earlier one)",
			name, n, inv.ID, uploadID)
	}
	return at.Artifacts[i], nil
}

// CompleteUpload reports inv with the pending upload uploadID of artifact
// name on attempt n of worker recorded as done at now (PendingUpload
// first), and the artifact as recorded.
func (inv Invocation) CompleteUpload(workerID string, n int, name, uploadID string, now time.Time) (Invocation, Artifact, error) {
	a, err := inv.PendingUpload(workerID, n, name, uploadID)
	if err != nil {
		return inv, Artifact{}, err
	}
	a.Pending, a.UploadID, a.CreatedAt = false, "", now
	return inv.withArtifact(n, a), a, nil
}

// withArtifact reports inv with a recorded on attempt n in place of any
// record of its name (n must be in the history).
func (inv Invocation) withArtifact(n int, a Artifact) Invocation {
	next := inv
	next.Attempts = slices.Clone(inv.Attempts)
	at := &next.Attempts[next.attemptIndex(n)]
	at.Artifacts = slices.Clone(at.Artifacts)
	if i := at.artifactIndex(a.Name); i >= 0 {
		at.Artifacts[i] = a
	} else {
		at.Artifacts = append(at.Artifacts, a)
	}
	return next
}

// artifactIndex reports the index of artifact name in a's records, or -1.
func (a Attempt) artifactIndex(name string) int {
	return slices.IndexFunc(a.Artifacts, func(r Artifact) bool { return r.Name == name })
}

// Published reports the artifacts of a whose upload was completed.
func (a Attempt) Published() []Artifact {
	var out []Artifact
	for _, r := range a.Artifacts {
		if !r.Pending {
			out = append(out, r)
		}
	}
	return out
}
