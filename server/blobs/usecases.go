package blobs

import (
	"context"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// UseCases is a Store in the use cases' words (control.Blobs): artifacts
// of attempts in domain types, never the wire's, at the keys Key names.
// A main hands UseCases{Store: s} to control.Config.Blobs.
type UseCases struct{ Store Store }

// PresignPut presigns the upload of artifact a of attempt n of invocation
// id (Store.PresignPut).
func (u UseCases) PresignPut(ctx context.Context, id string, n int, a domain.Artifact, ttl time.Duration) (domain.ArtifactUpload, error) {
	up, err := u.Store.PresignPut(ctx, Key(id, n, a.Name), a.Size, a.SHA256, a.ContentType, ttl)
	return up.Domain(), err
}

// Complete finishes the upload uploadID of artifact a of attempt n of
// invocation id (Store.Complete): its content must be a.Size bytes.
func (u UseCases) Complete(ctx context.Context, id string, n int, a domain.Artifact, uploadID string, parts []domain.ArtifactPart) error {
	return u.Store.Complete(ctx, Key(id, n, a.Name), uploadID, wire.ArtifactPartsOf(parts), a.Size)
}

// PresignGet presigns a download of artifact name of attempt n of
// invocation id (Store.PresignGet), saved as name.
func (u UseCases) PresignGet(ctx context.Context, id string, n int, name string, ttl time.Duration) (string, error) {
	return u.Store.PresignGet(ctx, Key(id, n, name), name, ttl)
}
