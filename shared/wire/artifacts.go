package wire

import (
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// Artifacts: files a body publishes through nymph (docs/artifacts.md).
// nymph asks the control plane for a presigned upload of one artifact of
// an attempt it holds (POST /v1/daemon/artifacts), streams the bytes
// there, then says it is complete (POST /v1/daemon/artifacts/complete),
// which records it on the attempt. Operators list and fetch them
// (GET /v1/invocations/{id}/artifacts, GET /v1/runs/{id}/artifacts).

// Limits of artifacts. The control plane enforces them when it presigns;
// a deploy may lower them (template parameters).
const (
	MaxArtifactNameBytes = 128
	// DefaultMaxArtifactBytes bounds one artifact: 5 GiB, S3's largest
	// single PUT, is the ceiling of a presigned single upload; past
	// MultipartThreshold an upload goes in parts.
	DefaultMaxArtifactBytes = domain.DefaultMaxArtifactBytes
	// DefaultMaxArtifactsPerAttempt bounds how many artifacts one attempt
	// records (a name published again replaces, and does not count twice).
	DefaultMaxArtifactsPerAttempt = domain.DefaultMaxArtifactsPerAttempt
	// MultipartThreshold: an artifact larger than this is uploaded in
	// parts of MultipartPartBytes (the last one shorter).
	MultipartThreshold int64 = 100 << 20
	MultipartPartBytes int64 = 64 << 20
)

// ArtifactUploadRequest is the body of POST /v1/daemon/artifacts: nymph
// asks where to upload one artifact of an attempt its worker holds.
type ArtifactUploadRequest struct {
	WorkerID     string `json:"worker_id"`
	InvocationID string `json:"invocation_id"`
	Attempt      int    `json:"attempt"`
	Name         string `json:"name"`
	Size         int64  `json:"size"`
	// SHA256 is the content's digest, lower-case hex.
	SHA256      string `json:"sha256"`
	ContentType string `json:"content_type,omitempty"`
}

// ArtifactUpload answers it: where the bytes go. A single upload is one
// PUT of the whole content to URL with Headers set; a multipart one is a
// PUT of each part to its URL, in any order, and the complete call lists
// each part's ETag (the PUT answer's ETag header).
type ArtifactUpload struct {
	// UploadID names this upload in the complete call.
	UploadID string            `json:"upload_id"`
	Method   string            `json:"method"` // PUT
	URL      string            `json:"url,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	// Parts, for a multipart upload: part n (from 1) is bytes
	// [(n-1)*PartSize, n*PartSize) of the content.
	PartSize  int64          `json:"part_size,omitempty"`
	Parts     []ArtifactPart `json:"parts,omitempty"`
	ExpiresAt time.Time      `json:"expires_at"`
}

// ArtifactPart is one part of a multipart upload: its number (from 1),
// its presigned URL, and, in the complete call, the ETag its PUT answered.
type ArtifactPart struct {
	Number int    `json:"number"`
	URL    string `json:"url,omitempty"`
	ETag   string `json:"etag,omitempty"`
}

// ArtifactCompleteRequest is the body of POST /v1/daemon/artifacts/complete.
type ArtifactCompleteRequest struct {
	WorkerID     string         `json:"worker_id"`
	InvocationID string         `json:"invocation_id"`
	Attempt      int            `json:"attempt"`
	Name         string         `json:"name"`
	UploadID     string         `json:"upload_id"`
	Parts        []ArtifactPart `json:"parts,omitempty"`
}

// Artifact is one recorded artifact, as operators and nymph see it.
type Artifact struct {
	Name        string    `json:"name"`
	Attempt     int       `json:"attempt"`
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"content_type,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	// Counted is true for an artifact of the attempt whose outcome is the
	// invocation's (Invocation.CountedAttempt); the others' are listed
	// apart, AttemptOutcome saying how their attempt ended.
	Counted        bool   `json:"counted"`
	AttemptOutcome string `json:"attempt_outcome,omitempty"`
	// URL is a short-lived GET of the content (operators' lists only).
	URL string `json:"url,omitempty"`
	// Index is the job's index in its run (run lists only).
	Index *int `json:"index,omitempty"`
	// InvocationID names the job (run lists only).
	InvocationID string `json:"invocation_id,omitempty"`
}

// ArtifactList answers GET /v1/invocations/{id}/artifacts and
// GET /v1/runs/{id}/artifacts.
type ArtifactList struct {
	Artifacts []Artifact `json:"artifacts"`
	// NextIndex, in a page of a run's artifacts (GET
	// /v1/runs/{id}/artifacts?from=&limit=), is the first job index of the
	// next page; absent after the run's last job.
	NextIndex int `json:"next_index,omitempty"`
}

// sha256Hex is a lower-case hex SHA-256 digest.
var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// CheckArtifactName checks an artifact's name: 1-128 bytes of UTF-8, no
// "/" or "\", not "." or "..", no control characters, and no leading or
// trailing space, so it is one plain file name wherever it lands.
func CheckArtifactName(name string) error {
	switch {
	case name == "":
		return invalid("artifact name is empty")
	case len(name) > MaxArtifactNameBytes:
		return invalid("artifact name is %d bytes; at most %d", len(name), MaxArtifactNameBytes)
	case !utf8.ValidString(name):
		return invalid("artifact name is not UTF-8")
	case name == "." || name == "..":
		return invalid("artifact name %q is not a file name", name)
	case strings.ContainsAny(name, `/\`):
		return invalid("artifact name %q holds a / or \\: a name is one plain file name", clip(name))
	case strings.TrimSpace(name) != name:
		return invalid("artifact name %q starts or ends with space", clip(name))
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return invalid("artifact name %q holds a control character", clip(name))
		}
	}
	return nil
}

// Validate checks an upload request's own fields (the limits are the
// control plane's to apply).
func (r ArtifactUploadRequest) Validate() error {
	if err := checkAttemptRef(r.WorkerID, r.InvocationID, r.Attempt); err != nil {
		return err
	}
	if err := CheckArtifactName(r.Name); err != nil {
		return err
	}
	if r.Size < 0 {
		return invalid("size %d is negative", r.Size)
	}
	if !sha256Hex.MatchString(r.SHA256) {
		return invalid("sha256 must be 64 lower-case hex digits")
	}
	return checkText("content_type", r.ContentType, 255, false)
}

// Validate checks a complete request's own fields.
func (r ArtifactCompleteRequest) Validate() error {
	if err := checkAttemptRef(r.WorkerID, r.InvocationID, r.Attempt); err != nil {
		return err
	}
	if err := CheckArtifactName(r.Name); err != nil {
		return err
	}
	if r.UploadID == "" || len(r.UploadID) > 1024 {
		return invalid("upload_id must be 1-1024 bytes")
	}
	if len(r.Parts) > 10_000 {
		return invalid("%d parts; at most 10000", len(r.Parts))
	}
	return nil
}

// checkAttemptRef checks the worker, invocation and attempt an artifact
// call names.
func checkAttemptRef(worker, invocation string, attempt int) error {
	if worker == "" || invocation == "" {
		return invalid("worker_id and invocation_id are required")
	}
	if attempt < 1 {
		return invalid("attempt %d: attempts count from 1", attempt)
	}
	return nil
}

// ContentTypeDir is the content type of a directory artifact: a gzipped
// tar of the directory's tree, entries relative to it (no leading "/",
// no ".."). `lakeshore artifacts get` unpacks such an artifact into a
// directory unless asked for the archive (--raw); any other content type
// is one file.
const ContentTypeDir = "application/vnd.lakeshore.dir+tar+gzip"

// Worker reports the worker the request acts for.
func (r *ArtifactUploadRequest) Worker() string { return r.WorkerID }

// Worker reports the worker the request acts for.
func (r *ArtifactCompleteRequest) Worker() string { return r.WorkerID }

// Request reports the upload request's domain form.
func (r ArtifactUploadRequest) Request() domain.ArtifactRequest {
	return domain.ArtifactRequest{WorkerID: r.WorkerID, InvocationID: r.InvocationID, Attempt: r.Attempt,
		Artifact: domain.Artifact{Name: r.Name, Size: r.Size, SHA256: r.SHA256, ContentType: r.ContentType}}
}

// Completion reports the complete request's domain form.
func (r ArtifactCompleteRequest) Completion() domain.ArtifactCompletion {
	return domain.ArtifactCompletion{WorkerID: r.WorkerID, InvocationID: r.InvocationID, Attempt: r.Attempt,
		Name: r.Name, UploadID: r.UploadID, Parts: domainParts(r.Parts)}
}

// ArtifactUploadOf reports the wire form of an upload.
func ArtifactUploadOf(u domain.ArtifactUpload) ArtifactUpload {
	return ArtifactUpload{UploadID: u.UploadID, Method: u.Method, URL: u.URL, Headers: u.Headers,
		PartSize: u.PartSize, Parts: ArtifactPartsOf(u.Parts), ExpiresAt: u.ExpiresAt}
}

// Domain reports an upload's domain form.
func (u ArtifactUpload) Domain() domain.ArtifactUpload {
	return domain.ArtifactUpload{UploadID: u.UploadID, Method: u.Method, URL: u.URL, Headers: u.Headers,
		PartSize: u.PartSize, Parts: domainParts(u.Parts), ExpiresAt: u.ExpiresAt}
}

// ArtifactPartsOf reports the wire form of upload parts (nil for none).
func ArtifactPartsOf(parts []domain.ArtifactPart) []ArtifactPart {
	var out []ArtifactPart
	for _, p := range parts {
		out = append(out, ArtifactPart(p))
	}
	return out
}

// domainParts reports the domain form of upload parts (nil for none).
func domainParts(parts []ArtifactPart) []domain.ArtifactPart {
	var out []domain.ArtifactPart
	for _, p := range parts {
		out = append(out, domain.ArtifactPart(p))
	}
	return out
}
