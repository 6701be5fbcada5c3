package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// PresignArtifact asks where to upload one artifact of an attempt the
// worker holds (POST /v1/daemon/artifacts).
func (c *Client) PresignArtifact(ctx context.Context, req wire.ArtifactUploadRequest) (wire.ArtifactUpload, error) {
	var out wire.ArtifactUpload
	_, err := c.Do(ctx, "presign artifact", http.MethodPost, "/v1/daemon/artifacts", nil, req, &out)
	return out, err
}

// CompleteArtifact says an upload is done and records the artifact on its
// attempt (POST /v1/daemon/artifacts/complete).
func (c *Client) CompleteArtifact(ctx context.Context, req wire.ArtifactCompleteRequest) (wire.Artifact, error) {
	var out wire.Artifact
	_, err := c.Do(ctx, "complete artifact", http.MethodPost, "/v1/daemon/artifacts/complete", nil, req, &out)
	return out, err
}

// InvocationArtifacts lists every artifact of every attempt of an
// invocation, each with a short-lived GET (GET /v1/invocations/{id}/artifacts).
func (c *Client) InvocationArtifacts(ctx context.Context, id string) (wire.ArtifactList, error) {
	var out wire.ArtifactList
	_, err := c.Do(ctx, "list artifacts", http.MethodGet, "/v1/invocations/"+url.PathEscape(id)+"/artifacts", nil, nil, &out)
	return out, err
}

// RunArtifacts lists the artifacts of every job of a run, each with its
// job's index, a page (GET /v1/runs/{id}/artifacts) at a time.
func (c *Client) RunArtifacts(ctx context.Context, id string) (wire.ArtifactList, error) {
	var all wire.ArtifactList
	from := 0
	for {
		page, err := c.RunArtifactsPage(ctx, id, from, 0)
		if err != nil {
			return all, err
		}
		all.Artifacts = append(all.Artifacts, page.Artifacts...)
		if page.NextIndex <= from {
			return all, nil
		}
		from = page.NextIndex
	}
}

// RunArtifactsPage lists the artifacts of jobs [from, from+limit) of a run
// (limit 0: the control plane's default); NextIndex, when set, is the next
// page's from.
func (c *Client) RunArtifactsPage(ctx context.Context, id string, from, limit int) (wire.ArtifactList, error) {
	q := query("from", positive(from), "limit", positive(limit))
	var out wire.ArtifactList
	_, err := c.Do(ctx, "list artifacts", http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/artifacts", q, nil, &out)
	return out, err
}

// DownloadArtifact copies listed artifact a's content from its presigned
// URL to w, and checks it is a.Size bytes whose SHA-256 is a.SHA256. The
// request carries no token: the URL is its own credential, and it goes to
// the blob store, not the control plane. w may have received content when
// the check fails.
func (c *Client) DownloadArtifact(ctx context.Context, a wire.Artifact, w io.Writer) error {
	if a.URL == "" {
		return fmt.Errorf("artifact %q has no download URL", a.Name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
	if err != nil {
		return fmt.Errorf("download artifact %q: %w", a.Name, err)
	}
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("download artifact %q: %w", a.Name, err)
	}
	defer drainClose(resp)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("download artifact %q: HTTP %d: %s", a.Name, resp.StatusCode, clip(string(body)))
	}
	h := sha256.New()
	// One byte past the size is enough to tell a longer content.
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(resp.Body, a.Size+1))
	if err != nil {
		return fmt.Errorf("download artifact %q: %w", a.Name, err)
	}
	switch {
	case n > a.Size:
		return fmt.Errorf("download artifact %q: more than its %d bytes", a.Name, a.Size)
	case n < a.Size:
		return fmt.Errorf("download artifact %q: %d bytes, want %d", a.Name, n, a.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		return fmt.Errorf("download artifact %q: sha256 %s, want %s: the content is not what was published", a.Name, got, a.SHA256)
	}
	return nil
}
