package config

import (
	"encoding/hex"
	"fmt"
	"strconv"
)

// Where artifacts' bytes go (docs/artifacts.md): an S3 bucket on AWS, or,
// for `lakeshore dev --lambdas` only, the dev server's artifacts directory
// (the bootstraps sign its URLs with the dev server's secret). Neither
// set: artifacts are off, and their routes answer 501.
const (
	EnvArtifactsBucket = "LAKESHORE_ARTIFACTS_BUCKET"
	EnvArtifactsDir    = "LAKESHORE_ARTIFACTS_DIR"
	EnvArtifactsURL    = "LAKESHORE_ARTIFACTS_URL"    // the dev server's base URL, with EnvArtifactsDir
	EnvArtifactsSecret = "LAKESHORE_ARTIFACTS_SECRET" // hex, with EnvArtifactsDir
	// The limits the control plane enforces when it presigns (template
	// parameters MaxArtifactBytes, MaxArtifactsPerAttempt); unset: the
	// defaults.
	EnvMaxArtifactBytes       = "LAKESHORE_MAX_ARTIFACT_BYTES"
	EnvMaxArtifactsPerAttempt = "LAKESHORE_MAX_ARTIFACTS_PER_ATTEMPT"
)

// Artifacts is the artifacts' configuration.
type Artifacts struct {
	Bucket string
	Dir    string
	URL    string
	Secret []byte
	// MaxBytes and MaxPerAttempt: 0 is the default.
	MaxBytes      int64
	MaxPerAttempt int
}

// LoadArtifacts reads the artifacts' configuration from getenv. A bucket
// and a directory together, or a directory without its URL and secret,
// is refused.
func LoadArtifacts(getenv func(string) string) (Artifacts, error) {
	a := Artifacts{Bucket: getenv(EnvArtifactsBucket), Dir: getenv(EnvArtifactsDir), URL: getenv(EnvArtifactsURL)}
	switch {
	case a.Bucket != "" && a.Dir != "":
		return Artifacts{}, fmt.Errorf("%s and %s exclude each other", EnvArtifactsBucket, EnvArtifactsDir)
	case a.Dir != "":
		secret, err := hex.DecodeString(getenv(EnvArtifactsSecret))
		if err != nil || len(secret) < 16 || a.URL == "" {
			return Artifacts{}, fmt.Errorf("%s needs %s and %s (hex, at least 16 bytes)", EnvArtifactsDir, EnvArtifactsURL, EnvArtifactsSecret)
		}
		a.Secret = secret
	}
	if s := getenv(EnvMaxArtifactBytes); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return Artifacts{}, fmt.Errorf("%s must be a whole number of bytes above 0, got %q", EnvMaxArtifactBytes, s)
		}
		a.MaxBytes = n
	}
	if s := getenv(EnvMaxArtifactsPerAttempt); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return Artifacts{}, fmt.Errorf("%s must be a whole number from 1 to 1000, got %q", EnvMaxArtifactsPerAttempt, s)
		}
		a.MaxPerAttempt = n
	}
	return a, nil
}
