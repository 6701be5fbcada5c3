package sigv4

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/dreamlake/lakeshore/agent/internal/imds"
	"github.com/dreamlake/lakeshore/agent/internal/imds/imdstest"
	"github.com/dreamlake/lakeshore/agent/internal/sigv4/sigv4test"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// testOptions are NewClient's options for controlPlane with the IMDS at
// imdsURL and an empty environment.
func testOptions(controlPlane, imdsURL string) Options {
	return Options{ControlPlane: controlPlane, IMDSEndpoint: imdsURL,
		Getenv: func(string) string { return "" }, Logger: slog.New(slog.DiscardHandler)}
}

// wantedErr reports whether a table case wants an error (want, a part of
// its message, is not empty), and fails t unless err is that error.
func wantedErr(t *testing.T, err error, want string) bool {
	t.Helper()
	if want == "" {
		return false
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err %v, want %q", err, want)
	}
	return true
}

// newTestClient is a signing client for controlPlane with the IMDS at
// imdsURL.
func newTestClient(t *testing.T, controlPlane, imdsURL string) *http.Client {
	t.Helper()
	hc, err := NewClient(&http.Client{Timeout: 30 * time.Second}, testOptions(controlPlane, imdsURL))
	if err != nil {
		t.Fatal(err)
	}
	return hc
}

// TestSignsDaemonRequests: the four daemon calls through shared/client
// arrive signed for the IMDS region, with the role's session token, the
// bearer token moved to X-Lakeshore-Token and the body intact.
func TestSignsDaemonRequests(t *testing.T) {
	f := imdstest.New(t, imdstest.State{Region: "eu-west-3"})
	plane := sigv4test.NewPlane(t, "eu-west-3", nil)
	hc := newTestClient(t, plane.URL, f.URL)
	ctx := context.Background()
	enroll := client.New(plane.URL, "enroll-tok", client.WithHTTPClient(hc))
	worker := enroll.WithToken("worker-tok")
	if _, err := enroll.Hello(ctx, wire.HelloRequest{MachineID: "m", BootID: "b", Lanes: []string{"q"}}); err != nil {
		t.Fatalf("hello: %v", err)
	}
	if _, err := worker.Poll(ctx, wire.PollRequest{}); err != nil {
		t.Fatalf("poll: %v", err)
	}
	ack := wire.AckRequest{WorkerID: "w-1", InvocationID: "inv-1", Attempt: 1, State: wire.StateSucceeded, StdoutTail: "ünïcode \"quoted\"\n"}
	if _, err := worker.Ack(ctx, ack); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := worker.Bye(ctx, wire.ByeRequest{Reason: wire.ByeSignal}); err != nil {
		t.Fatalf("bye: %v", err)
	}
	// A bodiless GET is signed over the empty payload.
	if _, err := worker.GetWorker(ctx, "w-1"); err != nil {
		t.Fatalf("get: %v", err)
	}
	seen := plane.Check(t)
	want := []struct{ path, token string }{
		{"/v1/daemon/hello", "enroll-tok"}, {"/v1/daemon/poll", "worker-tok"},
		{"/v1/daemon/ack", "worker-tok"}, {"/v1/daemon/bye", "worker-tok"}, {"/v1/workers/w-1", "worker-tok"},
	}
	if len(seen) != len(want) {
		t.Fatalf("saw %d requests, want %d", len(seen), len(want))
	}
	for i, w := range want {
		if seen[i].Path != w.path || seen[i].Token != w.token {
			t.Errorf("request %d: %s with token %q; want %s with %q", i, seen[i].Path, seen[i].Token, w.path, w.token)
		}
	}
	wantAck, _ := json.Marshal(ack)
	if got := bytes.TrimSpace(seen[2].Body); !bytes.Equal(got, wantAck) {
		t.Errorf("ack body arrived as %s, want %s", got, wantAck)
	}
	if f.Tokenless.Load() != 0 {
		t.Errorf("%d IMDSv1 (tokenless) requests", f.Tokenless.Load())
	}
}

// TestVerifierRejectsTampering keeps the verifier honest: a changed
// body, token or region fails it.
func TestVerifierRejectsTampering(t *testing.T) {
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ = io.ReadAll(r.Body)
		got = r
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	tr := &transport{base: http.DefaultTransport, creds: aws.NewCredentialsCache(credentialsFunc(imdstest.Creds)), signer: v4.NewSigner(), region: "us-east-1", host: u.Host}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/daemon/poll", strings.NewReader(`{"a":1}`))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := sigv4test.Verify(got, body, imdstest.Creds, "us-east-1"); err != nil {
		t.Fatalf("untampered: %v", err)
	}
	tests := []struct {
		name   string
		tamper func(r *http.Request, body []byte, region string) (*http.Request, []byte, string)
	}{
		{"body", func(r *http.Request, _ []byte, region string) (*http.Request, []byte, string) {
			return r, []byte(`{"a":2}`), region
		}},
		{"token", func(r *http.Request, body []byte, region string) (*http.Request, []byte, string) {
			r = r.Clone(context.Background())
			r.Header.Set(tokenHeader, "other")
			return r, body, region
		}},
		{"region", func(r *http.Request, body []byte, _ string) (*http.Request, []byte, string) {
			return r, body, "us-west-2"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, b, region := tt.tamper(got, body, "us-east-1")
			if err := sigv4test.Verify(r, b, imdstest.Creds, region); err == nil {
				t.Fatal("verified a tampered request")
			}
		})
	}
	if req.Header.Get("Authorization") != "Bearer tok" || req.Header.Get(tokenHeader) != "" {
		t.Errorf("the caller's request was changed: %v", req.Header)
	}
}

// credentialsFunc is a static aws.CredentialsProvider.
type credentialsFunc aws.Credentials

func (c credentialsFunc) Retrieve(context.Context) (aws.Credentials, error) {
	return aws.Credentials(c), nil
}

// TestCredentialsCached: concurrent and sequential requests share one
// fetch of the role credentials (and one IMDSv2 token).
func TestCredentialsCached(t *testing.T) {
	f := imdstest.New(t, imdstest.State{Region: "us-east-2"})
	plane := sigv4test.NewPlane(t, "us-east-2", nil)
	c := client.New(plane.URL, "worker-tok", client.WithHTTPClient(newTestClient(t, plane.URL, f.URL)))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := c.Poll(context.Background(), wire.PollRequest{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for range 4 {
		if _, err := c.Poll(context.Background(), wire.PollRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(plane.Check(t)); n != 12 {
		t.Fatalf("%d requests arrived, want 12", n)
	}
	if n, l := f.CredGETs.Load(), f.RoleLists.Load(); n != 1 || l != 1 {
		t.Errorf("credentials fetched %d times (role listed %d) for 12 requests; want once", n, l)
	}
	if n := f.TokenPUTs.Load(); n != 1 {
		// The region at start and the credentials share one IMDS client
		// and so one session token.
		t.Errorf("%d IMDSv2 token PUTs, want 1", n)
	}
}

// TestNoRegion: IAM mode against a host that names no region, with no
// --iam-region and no region from IMDS, fails at NewClient (so nymph at
// start) and says what to do.
func TestNoRegion(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	tests := []struct {
		name string
		imds func(t *testing.T) string
	}{
		{"imds without a region", func(t *testing.T) string { return imdstest.New(t, imdstest.State{}).URL }},
		{"imds down", func(*testing.T) string { return down.URL }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewClient(&http.Client{}, testOptions("https://lakeshore.example.com/prod", tt.imds(t)))
			if err == nil || !strings.Contains(err.Error(), "pass --iam-region") || !strings.Contains(err.Error(), "lakeshore.example.com") {
				t.Fatalf("NewClient: %v; want an error naming --iam-region", err)
			}
		})
	}
}

// TestRegionSources: --iam-region wins, then an execute-api host, then
// IMDS; only the last asks IMDS.
func TestRegionSources(t *testing.T) {
	tests := []struct {
		name, flag, url, want string
		imdsAsked             bool
		wantErr               string
	}{
		{name: "flag", flag: "eu-central-1", url: "https://abc123.execute-api.us-east-1.amazonaws.com/prod", want: "eu-central-1"},
		{name: "execute-api host", url: "https://abc123.execute-api.us-east-1.amazonaws.com/prod", want: "us-east-1"},
		{name: "execute-api host in China", url: "https://abc123.execute-api.cn-north-1.amazonaws.com.cn", want: "cn-north-1"},
		{name: "execute-api host, upper case, port", url: "https://ABC.Execute-API.US-WEST-2.amazonaws.com:443/", want: "us-west-2"},
		{name: "private API (vpce) host", url: "https://abc-vpce-0123.execute-api.eu-west-1.amazonaws.com/", want: "eu-west-1"},
		{name: "custom domain", url: "https://lakeshore.example.com", want: "sa-east-1", imdsAsked: true},
		{name: "look-alike host", url: "https://abc.execute-api.us-east-1.amazonaws.com.example.com", want: "sa-east-1", imdsAsked: true},
		{name: "no api id", url: "https://execute-api.us-east-1.amazonaws.com", want: "sa-east-1", imdsAsked: true},
		{name: "bad flag", flag: "US East", url: "https://x.example.com", wantErr: "--iam-region must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := imdstest.New(t, imdstest.State{Region: "sa-east-1"})
			got, _, err := regionFor(context.Background(), tt.flag, tt.url, newIMDSClient(f.URL))
			if wantedErr(t, err, tt.wantErr) {
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("region %q, %v; want %q", got, err, tt.want)
			}
			if asked := f.Regions.Load() > 0; asked != tt.imdsAsked {
				t.Errorf("IMDS asked: %v, want %v", asked, tt.imdsAsked)
			}
		})
	}
}

// TestNewClient: NewClient leaves the caller's client alone and asks IMDS
// nothing at start when the host names the region; the IMDS endpoint
// follows imds.Resolve, and IAM mode refuses IMDS turned off.
func TestNewClient(t *testing.T) {
	f := imdstest.New(t, imdstest.State{})
	t.Run("the caller's client is left alone", func(t *testing.T) {
		hc := &http.Client{Timeout: time.Second}
		got, err := NewClient(hc, testOptions("https://abc.execute-api.us-east-1.amazonaws.com", f.URL))
		if err != nil {
			t.Fatal(err)
		}
		if hc.Transport != nil || got == hc || got.Timeout != time.Second {
			t.Fatalf("caller's client changed or timeout lost: %+v → %+v", hc, got)
		}
		if _, ok := got.Transport.(*transport); !ok {
			t.Fatalf("transport %T, want *transport", got.Transport)
		}
		if f.Regions.Load() != 0 || f.CredGETs.Load() != 0 {
			t.Error("IMDS asked at start although the host names the region and credentials are fetched on use")
		}
	})
	endpoints := []struct {
		name, configured string
		env              map[string]string
		want, wantErr    string
	}{
		{name: "configured wins", configured: "http://a", env: map[string]string{"AWS_EC2_METADATA_DISABLED": "true", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://b"}, want: "http://a"},
		{name: "environment", env: map[string]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://b"}, want: "http://b"},
		{name: "default", want: imds.DefaultEndpoint},
		{name: "disabled", env: map[string]string{"AWS_EC2_METADATA_DISABLED": "TRUE"}, wantErr: "AWS_EC2_METADATA_DISABLED"},
	}
	for _, tt := range endpoints {
		t.Run("imds endpoint: "+tt.name, func(t *testing.T) {
			got, err := imdsEndpoint(tt.configured, func(k string) string { return tt.env[k] })
			if wantedErr(t, err, tt.wantErr) {
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("%q %v, want %q", got, err, tt.want)
			}
		})
	}
}

// TestSignsOnlyForTheControlPlane: a redirect to another host is
// neither signed nor sent (it would carry the role's session token).
func TestSignsOnlyForTheControlPlane(t *testing.T) {
	f := imdstest.New(t, imdstest.State{Region: "us-east-1"})
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	_, err := client.New(redirect.URL, "tok", client.WithHTTPClient(newTestClient(t, redirect.URL, f.URL))).Poll(context.Background(), wire.PollRequest{})
	if err == nil || !strings.Contains(err.Error(), "not signing a request to") {
		t.Fatalf("poll through a cross-host redirect: %v", err)
	}
	if elsewhere.Load() != 0 {
		t.Error("the redirect target was contacted")
	}
}

// TestMoveToken: only a bearer token moves; any Authorization goes.
func TestMoveToken(t *testing.T) {
	tests := []struct{ auth, want string }{
		{"Bearer abc", "abc"},
		{"bearer  abc ", "abc"},
		{"Basic dXNlcjpwdw==", ""},
		{"Bearer ", ""},
		{"", ""},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.auth != "" {
			h.Set("Authorization", tt.auth)
		}
		moveToken(h)
		if h.Get("Authorization") != "" || h.Get(tokenHeader) != tt.want {
			t.Errorf("%q: Authorization %q, %s %q; want none and %q", tt.auth, h.Get("Authorization"), tokenHeader, h.Get(tokenHeader), tt.want)
		}
	}
}

// TestCredentialsErrorIsClear: no role on the instance fails the
// request with an error that says where credentials were sought, and never
// reaches the control plane.
func TestCredentialsErrorIsClear(t *testing.T) {
	f := imdstest.New(t, imdstest.State{NoRole: true})
	plane := sigv4test.NewPlane(t, "us-east-1", nil)
	opts := testOptions(plane.URL, f.URL)
	opts.Region = "us-east-1"
	hc, err := NewClient(&http.Client{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.New(plane.URL, "secret-tok", client.WithHTTPClient(hc)).Poll(context.Background(), wire.PollRequest{})
	if err == nil || !strings.Contains(err.Error(), "instance role credentials from IMDS") || strings.Contains(err.Error(), "secret-tok") {
		t.Fatalf("poll: %v", err)
	}
	if !client.Retryable(err) {
		t.Errorf("a credentials failure should be retryable (IMDS may answer later): %v", err)
	}
	if n := len(plane.Check(t)); n != 0 {
		t.Errorf("%d unsigned requests reached the control plane", n)
	}
}
