package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/dreamlake/lakeshore/server/api/apitest"
)

// iamIMDS is an IMDSv2 on a real loopback socket with an instance role:
// PUT /latest/api/token issues a token (echoing its TTL, as the SDK
// requires), and the role list, the role's credentials and the region are
// served only to a GET carrying it. Anything else is 404 (a spot watcher
// polling it sees no notice).
type iamIMDS struct {
	*httptest.Server
	region string // "": placement/region is 404

	tokenPUTs atomic.Int32
	roleLists atomic.Int32 // GET iam/security-credentials/
	credGETs  atomic.Int32 // GET iam/security-credentials/<role>
	regions   atomic.Int32
	tokenless atomic.Int32 // metadata GETs without the token: IMDSv1
}

func newIAMIMDS(t *testing.T, region string) *iamIMDS {
	t.Helper()
	f := &iamIMDS{region: region}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) {
		f.tokenPUTs.Add(1)
		ttl := r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds")
		if ttl == "" {
			http.Error(w, "missing TTL", http.StatusBadRequest)
			return
		}
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", ttl)
		_, _ = io.WriteString(w, iamTestIMDSv2)
	})
	mux.HandleFunc("GET /latest/meta-data/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-aws-ec2-metadata-token") != iamTestIMDSv2 {
			f.tokenless.Add(1)
			http.Error(w, "", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/latest/meta-data/iam/security-credentials/":
			f.roleLists.Add(1)
			_, _ = io.WriteString(w, iamTestRole)
		case "/latest/meta-data/iam/security-credentials/" + iamTestRole:
			f.credGETs.Add(1)
			_ = json.NewEncoder(w).Encode(map[string]string{
				"Code": "Success", "Type": "AWS-HMAC",
				"LastUpdated":     time.Now().UTC().Format(time.RFC3339),
				"AccessKeyId":     iamTestKeyID,
				"SecretAccessKey": iamTestSecret,
				"Token":           iamTestToken,
				"Expiration":      time.Now().Add(6 * time.Hour).UTC().Format(time.RFC3339),
			})
		case "/latest/meta-data/placement/region":
			f.regions.Add(1)
			if f.region == "" {
				http.NotFound(w, r)
				return
			}
			_, _ = io.WriteString(w, f.region)
		default:
			http.NotFound(w, r)
		}
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// sigV4Seen is what a verifying control plane saw of one request.
type sigV4Seen struct {
	Path  string
	Token string // X-Lakeshore-Token
	Body  []byte
}

// verifySigV4 checks r (whose body was read into body) the way API Gateway
// would, independently of the transport under test: it rebuilds a request
// from only what the signature claims to cover (SignedHeaders, the host,
// the body), signs it again with creds for execute-api in region at the
// request's X-Amz-Date, and compares the Authorization headers.
func verifySigV4(r *http.Request, body []byte, creds aws.Credentials, region string) error {
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") {
		return fmt.Errorf("Authorization is not SigV4: %.24q…", auth)
	}
	_, rest, _ := strings.Cut(auth, "SignedHeaders=")
	signedList, _, ok := strings.Cut(rest, ",")
	if !ok || signedList == "" {
		return fmt.Errorf("no SignedHeaders in %q", auth)
	}
	signed := strings.Split(signedList, ";")
	for _, must := range []string{"host", "x-amz-date", "x-amz-security-token", "x-lakeshore-token"} {
		if !slices.Contains(signed, must) {
			return fmt.Errorf("%s is not signed (SignedHeaders=%s)", must, signedList)
		}
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return fmt.Errorf("X-Amz-Date: %w", err)
	}
	if d := time.Since(at); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("X-Amz-Date %s is %s off", at, d)
	}
	if got := r.Header.Get("X-Amz-Security-Token"); got != creds.SessionToken {
		return fmt.Errorf("X-Amz-Security-Token is not the role's session token")
	}
	cp, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	for _, name := range signed {
		if name == "host" || name == "content-length" {
			continue // from r.Host and the body
		}
		cp.Header[textproto.CanonicalMIMEHeaderKey(name)] = r.Header.Values(name)
	}
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, cp, hex.EncodeToString(sum[:]), "execute-api", region, at); err != nil {
		return err
	}
	if want := cp.Header.Get("Authorization"); want != auth {
		return fmt.Errorf("signature mismatch:\n got %s\nwant %s", auth, want)
	}
	return nil
}

// sigV4Plane is a control-plane stand-in that verifies every request's
// signature and records it; next answers it (nil: 200 {}).
type sigV4Plane struct {
	*httptest.Server
	region string
	next   http.Handler

	mu   sync.Mutex
	seen []sigV4Seen
	errs []error
}

func newSigV4Plane(t *testing.T, region string, next http.Handler) *sigV4Plane {
	t.Helper()
	p := &sigV4Plane{region: region, next: next}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.Close)
	return p
}

func (p *sigV4Plane) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = verifySigV4(r, body, iamTestCreds, p.region)
	}
	if err == nil && r.ContentLength != int64(len(body)) {
		err = fmt.Errorf("Content-Length %d, body %d bytes", r.ContentLength, len(body))
	}
	tok := r.Header.Get(tokenHeader)
	if err == nil && tok == "" {
		err = errors.New("no " + tokenHeader)
	}
	p.mu.Lock()
	p.seen = append(p.seen, sigV4Seen{Path: r.URL.Path, Token: tok, Body: body})
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s %s: %w", r.Method, r.URL.Path, err))
	}
	p.mu.Unlock()
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"error":{"code":"forbidden","message":"signature"}}`)
		return
	}
	if p.next == nil {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	p.next.ServeHTTP(w, r)
}

func (p *sigV4Plane) check(t *testing.T) []sigV4Seen {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, err := range p.errs {
		t.Error(err)
	}
	return slices.Clone(p.seen)
}

// iamTestConfig is a valid agent config in IAM mode against controlPlane
// with the IMDS at imdsURL.
func iamTestConfig(t *testing.T, controlPlane, imdsURL string) Config {
	dir := t.TempDir()
	return Config{
		ControlPlane: controlPlane, EnrollToken: apitest.EnrollToken, Queue: "q",
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
		MachineID: "iam-host", IntrospectAddr: "off", Grace: DefaultGrace, KillAfter: time.Second,
		Logger:       slog.New(slog.DiscardHandler),
		IAM:          true,
		IMDSEndpoint: imdsURL,
	}
}
