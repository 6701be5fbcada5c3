// Package sigv4 is nymph's IAM mode (--iam): the control plane's daemon
// routes sit behind API Gateway's AWS_IAM authorizer, so every request
// nymph sends is signed with AWS Signature V4 for execute-api using the EC2
// instance role (its credentials from IMDS through agent/internal/imds),
// and the bearer token moves out of Authorization (which carries the
// signature) into X-Lakeshore-Token. The agent's config builds its HTTP
// client with NewClient; its loop opens the wake socket with WakeClient.
// docs/security.md, "IAM mode", has the design.
package sigv4

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"

	"github.com/dreamlake/lakeshore/agent/internal/imds"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const (
	// tokenHeader carries the enrollment or worker token in IAM mode.
	tokenHeader = wire.TokenHeader
	// service is the SigV4 service name of API Gateway's invoke API.
	service = "execute-api"
	// expiryWindow refreshes the role credentials this long before they
	// expire, so a request signed just before expiry is not refused in
	// flight (the SDK's own default chain uses the same window for them).
	expiryWindow = 5 * time.Minute
	// credentialsTimeout bounds one fetch of the role credentials from
	// IMDS (token, role name, credentials, with the client's retries);
	// the request's own deadline still applies.
	credentialsTimeout = 5 * time.Second
	// regionTimeout bounds the start-up lookup of the instance's region.
	regionTimeout = 2 * time.Second
)

// transport signs each request with SigV4 for execute-api and moves its
// bearer token into tokenHeader, then hands it to base.
type transport struct {
	base   http.RoundTripper
	creds  aws.CredentialsProvider // cached: one IMDS fetch per credentials lifetime
	signer *v4.Signer
	region string
	// host is the control plane's (host[:port]): the only one signed for,
	// so a redirect elsewhere gets neither a signature nor the role's
	// session token.
	host  string
	clock clock.Clock // signing time
	// upgrade signs only the host, the date, the session token and the
	// token header (the wake socket's WebSocket upgrade): the hop-by-hop
	// upgrade headers (Connection, Upgrade, Sec-WebSocket-*) may be
	// rewritten on the way to API Gateway, and a signature over them
	// would then fail.
	upgrade bool
}

var _ http.RoundTripper = (*transport)(nil)

// RoundTrip sends a signed copy of req. Like every RoundTripper it leaves
// req itself alone (but for consuming and closing its body), so an
// http.Client that follows a redirect starts again from the original, and
// its stripping of Authorization on a cross-host redirect still keeps the
// token from the other host.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := drainBody(req)
	if !strings.EqualFold(req.URL.Host, t.host) {
		return nil, fmt.Errorf("iam: not signing a request to %s: only the control plane %s", req.URL.Host, t.host)
	}
	if err != nil {
		return nil, fmt.Errorf("iam: read request body: %w", err)
	}
	r := req.Clone(req.Context())
	// The payload hash covers the body, so it is sent exactly as hashed
	// and with a Content-Length (signed too), never chunked.
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body, r.GetBody = http.NoBody, nil
	} else {
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	moveToken(r.Header)

	ctx, cancel := context.WithTimeout(r.Context(), credentialsTimeout)
	creds, err := t.creds.Retrieve(ctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("iam: instance role credentials from IMDS: %w", err)
	}
	sum := sha256.Sum256(body)
	signed := r
	if t.upgrade {
		signed = &http.Request{Method: r.Method, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if tok := r.Header.Get(tokenHeader); tok != "" {
			signed.Header.Set(tokenHeader, tok)
		}
	}
	if err := t.signer.SignHTTP(r.Context(), creds, signed, hex.EncodeToString(sum[:]), service, t.region, t.clock.Now()); err != nil {
		return nil, fmt.Errorf("iam: sign request: %w", err)
	}
	if t.upgrade {
		for _, h := range []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token"} {
			if v := signed.Header.Get(h); v != "" {
				r.Header.Set(h, v)
			}
		}
	}
	return t.base.RoundTrip(r)
}

// WakeClient returns the client nymph opens the wake socket at wakeURL
// with: hc itself, or in IAM mode (hc came from NewClient) a copy that
// signs the WebSocket upgrade for the wake channel's host, where the
// $connect route sits behind AWS_IAM too. The URL came from hello, over
// the signed channel to the control plane, and passed the agent's
// checkWakeURL.
func WakeClient(hc *http.Client, wakeURL string) *http.Client {
	t, ok := hc.Transport.(*transport)
	if !ok {
		return hc
	}
	u, err := url.Parse(wakeURL)
	if err != nil {
		return hc // the dial fails on it, as it would anyway
	}
	wt := *t
	wt.host, wt.upgrade = u.Host, true
	cp := *hc
	cp.Transport = &wt
	return &cp
}

// drainBody reads and closes req's body (nil when there is none).
func drainBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	return io.ReadAll(req.Body)
}

// moveToken takes the token of an "Authorization: Bearer <token>" header
// into tokenHeader. Any Authorization header goes: the signature replaces
// it.
func moveToken(h http.Header) {
	auth := h.Get("Authorization")
	h.Del("Authorization")
	scheme, tok, ok := strings.Cut(auth, " ")
	if tok = strings.TrimSpace(tok); ok && strings.EqualFold(scheme, "Bearer") && tok != "" {
		h.Set(tokenHeader, tok)
	}
}

// Options configure NewClient.
type Options struct {
	// ControlPlane is the control plane's base URL (--control-plane): the
	// only host signed for, and the region's first source after Region.
	ControlPlane string
	// Region is the region to sign for (--iam-region); empty: the control
	// plane's execute-api host's, else the instance's from IMDS.
	Region string
	// IMDSEndpoint is the agent's own IMDS base URL (Config.IMDSEndpoint);
	// empty: imds.Resolve's rule.
	IMDSEndpoint string
	// Getenv reads the IMDS environment for imds.Resolve; nil: os.Getenv.
	Getenv func(string) string
	// Clock dates each signature; the zero value is real time.
	Clock clock.Clock
	// Logger, if set, hears the region and where it came from.
	Logger *slog.Logger
}

// NewClient returns a copy of hc whose requests are signed for IAM mode:
// the region is o.Region, else the control plane's execute-api host's,
// else the instance's from IMDS; the credentials are the instance role's,
// from IMDSv2 at o.IMDSEndpoint (else $AWS_EC2_METADATA_SERVICE_ENDPOINT,
// else the default), fetched on the first request and cached until shortly
// before they expire. hc itself is left alone.
func NewClient(hc *http.Client, o Options) (*http.Client, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	endpoint, err := imdsEndpoint(o.IMDSEndpoint, getenv)
	if err != nil {
		return nil, err
	}
	md := newIMDSClient(endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), regionTimeout)
	defer cancel()
	region, source, err := regionFor(ctx, o.Region, o.ControlPlane, md)
	if err != nil {
		return nil, err
	}
	if o.Logger != nil {
		o.Logger.Info("iam mode: signing control-plane requests with the instance role",
			"region", region, "region_source", source, "imds", endpoint)
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	u, err := url.Parse(o.ControlPlane)
	if err != nil {
		return nil, fmt.Errorf("--control-plane: %w", err)
	}
	provider := ec2rolecreds.New(func(o *ec2rolecreds.Options) { o.Client = md })
	cp := *hc
	cp.Transport = &transport{
		base: base,
		creds: aws.NewCredentialsCache(provider, func(co *aws.CredentialsCacheOptions) {
			co.ExpiryWindow = expiryWindow
		}),
		signer: v4.NewSigner(),
		region: region,
		host:   u.Host,
		clock:  o.Clock,
	}
	return &cp, nil
}

// imdsEndpoint picks the IMDS base URL for the role credentials
// (imds.Resolve). With IMDS turned off (AWS_EC2_METADATA_DISABLED=true and
// no endpoint configured) IAM mode has no credentials, which is an error.
func imdsEndpoint(configured string, getenv func(string) string) (string, error) {
	endpoint, src := imds.Resolve(configured, getenv)
	if src == imds.None {
		return "", errors.New("--iam signs with the instance role's credentials from the EC2 instance metadata service, which AWS_EC2_METADATA_DISABLED=true turns off")
	}
	return endpoint, nil
}

// newIMDSClient is the IMDSv2 client for the role credentials. Unlike
// the machine-id lookup it keeps the SDK's retries: a credentials refresh
// that fails stops every request.
func newIMDSClient(endpoint string) imds.Getter {
	return imds.New(endpoint, imds.Options{Retries: true})
}

// Where regionFor found the region (logged as region_source).
const (
	regionFromFlag = "flag"
	regionFromHost = "control-plane-host"
	regionFromIMDS = "imds"
)

// regionFor reports the region to sign for and where it came from: flag
// (--iam-region) if set, else the region in an execute-api control-plane
// host, else the instance's region from IMDS. None is an error naming
// --iam-region.
func regionFor(ctx context.Context, flag, controlPlane string, md imds.Getter) (region, source string, err error) {
	if flag != "" {
		if !plausibleRegion(flag) {
			return "", "", fmt.Errorf("--iam-region must be an AWS region such as us-east-1, got %q", flag)
		}
		return flag, regionFromFlag, nil
	}
	u, err := url.Parse(controlPlane)
	if err != nil {
		return "", "", fmt.Errorf("--control-plane: %w", err)
	}
	if r, ok := executeAPIRegion(u.Hostname()); ok {
		return r, regionFromHost, nil
	}
	r, err := imdsRegion(ctx, md)
	if err == nil {
		return r, regionFromIMDS, nil
	}
	return "", "", fmt.Errorf("--iam: no AWS region to sign for: %s is not an execute-api host (<id>.execute-api.<region>.amazonaws.com) and the instance metadata service did not give one (%w); pass --iam-region", u.Hostname(), err)
}

// imdsRegion asks IMDS for the instance's region (placement/region: a bare
// name, unlike the SDK's GetRegion, which parses the whole instance
// identity document for it).
func imdsRegion(ctx context.Context, md imds.Getter) (string, error) {
	b, _, err := imds.Get(ctx, md, "placement/region", 64)
	if err != nil {
		return "", err
	}
	if r := strings.TrimSpace(string(b)); plausibleRegion(r) {
		return r, nil
	}
	return "", fmt.Errorf("implausible region %q", b)
}

// executeAPIRegion reports the region of an API Gateway invoke host,
// <id>.execute-api.<region>.amazonaws.com or .amazonaws.com.cn.
func executeAPIRegion(host string) (string, bool) {
	labels := strings.Split(strings.ToLower(strings.TrimSuffix(host, ".")), ".")
	if len(labels) < 5 || labels[0] == "" || labels[1] != "execute-api" {
		return "", false
	}
	switch suffix := strings.Join(labels[3:], "."); suffix {
	case "amazonaws.com", "amazonaws.com.cn":
	default:
		return "", false
	}
	if !plausibleRegion(labels[2]) {
		return "", false
	}
	return labels[2], true
}

// plausibleRegion reports whether s could be a region name (us-east-1,
// cn-north-1, us-gov-west-1): lower-case letters, digits and inner
// hyphens.
func plausibleRegion(s string) bool {
	if s == "" || len(s) > 32 || strings.HasPrefix(s, "-") || strings.HasSuffix(s, "-") || !strings.Contains(s, "-") {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}
