// Package blobslambda gives a route Lambda its artifacts' blob store
// (docs/artifacts.md): the api function, which serves every artifact
// route (nymph's presign and complete, the operator's lists), adds Hook to
// its start, so the daemon functions that run per invocation do not link
// the S3 client (make check).
package blobslambda

import (
	"os"

	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/lambdamain"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Hook sets the use cases' blob store and limits from the environment
// (config.LoadArtifacts): the bucket LAKESHORE_ARTIFACTS_BUCKET, or, under
// `lakeshore dev --lambdas`, the dev server's directory. Neither: the
// artifact routes answer 501. A malformed setting ends the INIT.
func Hook(s lambdamain.Start, c *control.Config) {
	a, err := config.LoadArtifacts(os.Getenv)
	s.Check("read the artifacts' configuration", err)
	store, err := Open(s, a)
	s.Check("open the artifacts' store", err)
	if store != nil {
		c.Blobs = blobs.UseCases{Store: store}
	}
	c.ArtifactLimits = domain.ArtifactLimits{MaxBytes: a.MaxBytes, MaxPerAttempt: a.MaxPerAttempt}
}

// Open returns the store a names (nil: none).
func Open(s lambdamain.Start, a config.Artifacts) (blobs.Store, error) {
	switch {
	case a.Bucket != "":
		return blobs.NewS3FromConfig(s.AWS, a.Bucket), nil
	case a.Dir != "":
		return blobs.NewDir(a.Dir, a.URL, a.Secret)
	}
	return nil, nil
}
