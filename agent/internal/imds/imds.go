// Package imds is the agent's one way to the EC2 instance metadata service:
// the AWS SDK's IMDSv2 client, set up one way (no proxy, never IMDSv1), with
// one rule for which endpoint to use. The machine id
// (agent/internal/machineid), the instance role's credentials (nymph
// --iam, agent/internal/sigv4) and the spot watcher (agent/internal/spot)
// all go through it; make check keeps every other agent package from
// importing the SDK's IMDS client.
package imds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	sdkimds "github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

// DefaultEndpoint is IMDS's link-local address on EC2.
const DefaultEndpoint = "http://169.254.169.254"

// Environment variables the SDK documents, read here (and only here) so a
// test can pass its own.
const (
	EnvDisabled = "AWS_EC2_METADATA_DISABLED"
	EnvEndpoint = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
)

// Source says where Resolve found an endpoint.
type Source int

// Where an endpoint came from.
const (
	None       Source = iota // IMDS is off: AWS_EC2_METADATA_DISABLED=true and nothing configured
	Configured               // the agent's own configuration (--imds-endpoint, tests)
	FromEnv                  // AWS_EC2_METADATA_SERVICE_ENDPOINT
	Default                  // nothing said: the link-local address, there only on EC2
)

// Resolve reports the IMDS base URL to use and where it came from. The
// agent's configuration wins; else AWS_EC2_METADATA_DISABLED=true turns IMDS
// off; else AWS_EC2_METADATA_SERVICE_ENDPOINT; else DefaultEndpoint.
func Resolve(configured string, getenv func(string) string) (string, Source) {
	if configured != "" {
		return configured, Configured
	}
	if strings.EqualFold(strings.TrimSpace(getenv(EnvDisabled)), "true") {
		return "", None
	}
	if env := getenv(EnvEndpoint); env != "" {
		return env, FromEnv
	}
	return DefaultEndpoint, Default
}

// Options adjust New.
type Options struct {
	// HTTP carries the requests; nil means a client that never uses a
	// proxy (IMDS is link-local: through a proxy it would answer for the
	// proxy's host, if at all).
	HTTP *http.Client
	// Retries keeps the SDK's retries (for a credentials refresh, whose
	// failure stops every request); without it each call is one try, for
	// callers that bound the whole exchange or poll again anyway.
	Retries bool
}

// New returns an IMDSv2 client for endpoint with every setting explicit, so
// the SDK reads nothing of the process environment behind Resolve's back.
func New(endpoint string, o Options) *sdkimds.Client {
	opts := sdkimds.Options{
		Endpoint:          endpoint,
		ClientEnableState: sdkimds.ClientEnabled,
		EnableFallback:    aws.FalseTernary,
	}
	if o.HTTP != nil {
		opts.HTTPClient = o.HTTP
	} else {
		opts.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) { tr.Proxy = nil })
	}
	if !o.Retries {
		opts.Retryer = aws.NopRetryer{}
	}
	return sdkimds.New(opts)
}

// Getter is the one call Get makes: the SDK client's, or a test's.
type Getter interface {
	GetMetadata(context.Context, *sdkimds.GetMetadataInput, ...func(*sdkimds.Options)) (*sdkimds.GetMetadataOutput, error)
}

var _ Getter = (*sdkimds.Client)(nil)

// Get reads metadata path (under latest/meta-data/), at most limit bytes
// of it. ok is false when IMDS has nothing there (404). A token IMDS
// refused (401: it restarted, or the token ran out) makes the client drop
// it and mark the error retryable; Get then asks once more, with a fresh
// token, whatever the client's own retries.
func Get(ctx context.Context, c Getter, path string, limit int64) (body []byte, ok bool, err error) {
	for try := 0; ; try++ {
		body, ok, err = get(ctx, c, path, limit)
		if try > 0 || !tokenRefused(err) {
			return body, ok, err
		}
	}
}

// tokenRefused reports whether err is IMDS refusing the session token: the
// SDK's client answers a 401 with an error it marks retryable (and drops
// the token), the one error it marks so.
func tokenRefused(err error) bool {
	var r interface{ RetryableError() bool }
	return Status(err) == http.StatusUnauthorized || (errors.As(err, &r) && r.RetryableError())
}

func get(ctx context.Context, c Getter, path string, limit int64) ([]byte, bool, error) {
	out, err := c.GetMetadata(ctx, &sdkimds.GetMetadataInput{Path: path})
	if Status(err) == http.StatusNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("imds: %s: %w", path, err)
	}
	defer out.Content.Close()
	b, err := io.ReadAll(io.LimitReader(out.Content, limit))
	if err != nil {
		return nil, false, fmt.Errorf("imds: %s: %w", path, err)
	}
	return b, true, nil
}

// Status reports the HTTP status IMDS answered err with (0: none).
func Status(err error) int {
	var re interface{ HTTPStatusCode() int } // the SDK's smithy response error
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}
