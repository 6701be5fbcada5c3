// Package blobs is where artifacts' bytes live (docs/artifacts.md): the
// control plane never carries them. It presigns uploads for nymph and
// downloads for operators; the bytes go straight between them and the
// storage. Two stores keep the one shape: S3 (a deployment, moto with
// `lakeshore dev --store aws`) and Dir, a directory behind URLs the
// control plane signs itself (`lakeshore dev --artifacts-dir`).
package blobs

import (
	"context"
	"strconv"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// Store presigns and completes uploads of artifacts and presigns their
// downloads. Keys are the store's own (Key); every method is safe for
// concurrent use. An error the caller must fix (a bad key or size, an
// upload not as announced) is a wire error of CodeInvalid; any other is
// the store's own failure.
type Store interface {
	// PresignPut reports how to upload size bytes whose SHA-256 is
	// sha256Hex to key, valid for ttl (at most MaxTTL): one PUT up to
	// wire.MultipartThreshold, parts of wire.MultipartPartBytes past it.
	// A single PUT of other content is refused (by S3 against the
	// SHA-256, by Dir against the SHA-256 and the size).
	PresignPut(ctx context.Context, key string, size int64, sha256Hex, contentType string, ttl time.Duration) (wire.ArtifactUpload, error)
	// Complete finishes the upload uploadID of key: a single one (no
	// parts) is checked, a multipart one is assembled from parts, which
	// must list every part PresignPut gave, in order, with the ETag its
	// PUT answered. It fails when the content is not there, or its size
	// is not size; then what key held before stays. An upload reaches
	// its key only here.
	Complete(ctx context.Context, key, uploadID string, parts []wire.ArtifactPart, size int64) error
	// PresignGet reports a GET of key valid for ttl (at most MaxTTL),
	// which downloads as filename.
	PresignGet(ctx context.Context, key, filename string, ttl time.Duration) (string, error)
}

// Key is where an attempt's artifact lives in a store:
// artifacts/<invocation>/<attempt>/<name>.
func Key(invocationID string, attempt int, name string) string {
	return "artifacts/" + invocationID + "/" + strconv.Itoa(attempt) + "/" + name
}
