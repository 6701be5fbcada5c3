// Package sigv4test checks requests the way API Gateway's AWS_IAM
// authorizer would, for the tests of agent/internal/sigv4 and of the agent
// in IAM mode: Verify re-signs a request independently of the transport
// under test, and Plane is a control-plane stand-in that verifies every
// request it gets. Only tests link it: make check refuses a binary that
// does.
package sigv4test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/dreamlake/lakeshore/agent/internal/imds/imdstest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Verify checks r (whose body was read into body) the way API Gateway
// would, independently of the transport under test: it rebuilds a request
// from only what the signature claims to cover (SignedHeaders, the host,
// the body), signs it again with creds for execute-api in region at the
// request's X-Amz-Date, and compares the Authorization headers.
func Verify(r *http.Request, body []byte, creds aws.Credentials, region string) error {
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
		return fmt.Errorf("rebuild the request: %w", err)
	}
	for _, name := range signed {
		if name == "host" || name == "content-length" {
			continue // from r.Host and the body
		}
		cp.Header[textproto.CanonicalMIMEHeaderKey(name)] = r.Header.Values(name)
	}
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, cp, hex.EncodeToString(sum[:]), "execute-api", region, at); err != nil {
		return fmt.Errorf("sign again: %w", err)
	}
	if want := cp.Header.Get("Authorization"); want != auth {
		return fmt.Errorf("signature mismatch:\n got %s\nwant %s", auth, want)
	}
	return nil
}

// Seen is what a Plane saw of one request.
type Seen struct {
	Path          string
	Token         string // X-Lakeshore-Token
	Body          []byte
	SignedHeaders string // as the signature lists them: "host;x-amz-date;..."
}

// Plane is a stand-in for API Gateway's AWS_IAM authorization in front of
// the control plane or the wake channel's WebSocket API: it verifies every
// request's signature against imdstest.Creds in its region and records it;
// a request that fails is answered 403, one that passes goes to next (nil:
// 200 {}).
type Plane struct {
	*httptest.Server
	region string
	next   http.Handler

	mu   sync.Mutex
	seen []Seen
	errs []error
}

// NewPlane starts a Plane for region; it stops when t ends.
func NewPlane(t testing.TB, region string, next http.Handler) *Plane {
	t.Helper()
	p := &Plane{region: region, next: next}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.Close)
	return p
}

func (p *Plane) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = Verify(r, body, imdstest.Creds, p.region)
	}
	if err == nil && r.ContentLength != int64(len(body)) {
		err = fmt.Errorf("Content-Length %d, body %d bytes", r.ContentLength, len(body))
	}
	tok := r.Header.Get(wire.TokenHeader)
	if err == nil && tok == "" {
		err = errors.New("no " + wire.TokenHeader)
	}
	p.mu.Lock()
	_, signed, _ := strings.Cut(r.Header.Get("Authorization"), "SignedHeaders=")
	signed, _, _ = strings.Cut(signed, ",")
	p.seen = append(p.seen, Seen{Path: r.URL.Path, Token: tok, Body: body, SignedHeaders: signed})
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

// Check fails t for each request that did not verify, and reports every
// request seen so far.
func (p *Plane) Check(t testing.TB) []Seen {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, err := range p.errs {
		t.Error(err)
	}
	return slices.Clone(p.seen)
}

// Requests reports how many requests the Plane has seen, verified or not.
func (p *Plane) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// WebSocketURL is the ws:// URL of path on the Plane.
func (p *Plane) WebSocketURL(path string) string {
	return "ws" + strings.TrimPrefix(p.URL, "http") + path
}
