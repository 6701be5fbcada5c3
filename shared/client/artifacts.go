package client

import (
	"context"
	"net/http"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// PresignArtifact asks where to upload one artifact of an attempt the
// worker holds (POST /v1/daemon/artifacts), with the worker token. The
// answer is a single presigned PUT or one per part (wire.ArtifactUpload).
func (c *Client) PresignArtifact(ctx context.Context, req wire.ArtifactUploadRequest) (wire.ArtifactUpload, error) {
	var out wire.ArtifactUpload
	_, err := c.Do(ctx, "presign artifact", http.MethodPost, "/v1/daemon/artifacts", nil, req, &out)
	return out, err
}

// CompleteArtifact says an artifact's bytes are uploaded (POST
// /v1/daemon/artifacts/complete), with the worker token; the answer is the
// artifact as recorded on the attempt.
func (c *Client) CompleteArtifact(ctx context.Context, req wire.ArtifactCompleteRequest) (wire.Artifact, error) {
	var out wire.Artifact
	_, err := c.Do(ctx, "complete artifact", http.MethodPost, "/v1/daemon/artifacts/complete", nil, req, &out)
	return out, err
}
