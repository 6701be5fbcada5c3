package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/dreamlake/lakeshore/agent/internal/imds"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/lambdahttp"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The instance role the fake IMDS hands out.
const (
	iamTestRole   = "lakeshore-fleet"
	iamTestKeyID  = "ASIAFAKEKEYFORTESTS1"
	iamTestSecret = "fake/secret/key/for/tests/only/0123456789"
	iamTestToken  = "FwoGZXIvYXdzEFakeSessionTokenForTests//"
	iamTestIMDSv2 = "AQAEAFakeIMDSTokenForIAMTests=="
)

// iamTestCreds is what a verifier signs with: the fake IMDS's credentials.
var iamTestCreds = aws.Credentials{AccessKeyID: iamTestKeyID, SecretAccessKey: iamTestSecret, SessionToken: iamTestToken}

// TestIAMSignsDaemonRequests: the four daemon calls through shared/client
// arrive signed for the IMDS region, with the role's session token, the
// bearer token moved to X-Lakeshore-Token and the body intact.
func TestIAMSignsDaemonRequests(t *testing.T) {
	f := newIAMIMDS(t, "eu-west-3")
	plane := newSigV4Plane(t, "eu-west-3", nil)
	cfg, err := iamTestConfig(t, plane.URL, f.URL).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	enroll := client.New(plane.URL, "enroll-tok", client.WithHTTPClient(cfg.HTTP))
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
	seen := plane.check(t)
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
	if f.tokenless.Load() != 0 {
		t.Errorf("%d IMDSv1 (tokenless) requests", f.tokenless.Load())
	}
}

// TestIAMVerifierRejectsTampering keeps the verifier honest: a changed
// body, token or region fails it.
func TestIAMVerifierRejectsTampering(t *testing.T) {
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ = io.ReadAll(r.Body)
		got = r
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	tr := &iamTransport{base: http.DefaultTransport, creds: aws.NewCredentialsCache(credentialsFunc(iamTestCreds)), signer: v4.NewSigner(), region: "us-east-1", host: u.Host}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/daemon/poll", strings.NewReader(`{"a":1}`))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := verifySigV4(got, body, iamTestCreds, "us-east-1"); err != nil {
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
			if err := verifySigV4(r, b, iamTestCreds, region); err == nil {
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

// TestIAMAgentEndToEnd runs an IAM-mode agent against the real router
// behind a verifying stand-in for API Gateway: hello, poll, ack and bye all
// arrive signed with the instance role's credentials, fetched from IMDS
// once.
func TestIAMAgentEndToEnd(t *testing.T) {
	p := apitest.New(t, func(c *apitest.Config) { c.DaemonAuth = auth.DaemonAuthIAM })
	f := newIAMIMDS(t, "ap-southeast-2")
	plane := newSigV4Plane(t, "ap-southeast-2", apiGateway(p.Handler, iamTestInstance))
	op := client.New(p.URL, apitest.OperatorToken)
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := iamTestConfig(t, plane.URL, f.URL)
	cfg.MachineID = iamTestInstance // IAM mode: the machine is the calling instance
	cfg.PollInterval = 50 * time.Millisecond
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.testHookRunStarted = func(string) { a.Stop() } // drain once the work is taken
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	got, err := op.GetInvocation(context.Background(), inv.InvocationID)
	if err != nil || got.State != wire.StateSucceeded {
		t.Fatalf("invocation: %+v %v", got, err)
	}
	paths := map[string]int{}
	for _, s := range plane.check(t) {
		paths[s.Path]++
		wantEnroll := s.Path == "/v1/daemon/hello"
		if (s.Token == apitest.EnrollToken) != wantEnroll {
			t.Errorf("%s carried the %s token", s.Path, map[bool]string{true: "enrollment", false: "worker"}[s.Token == apitest.EnrollToken])
		}
	}
	for _, route := range []string{"hello", "poll", "ack", "bye"} {
		if paths["/v1/daemon/"+route] == 0 {
			t.Errorf("no %s reached the control plane (saw %v)", route, paths)
		}
	}
	if n, l := f.credGETs.Load(), f.roleLists.Load(); n != 1 || l != 1 {
		t.Errorf("credentials fetched %d times (role listed %d) for %d requests; want once", n, l, len(plane.check(t)))
	}
}

// iamTestInstance is the instance the fake role session belongs to.
const iamTestInstance = "i-0123456789abcdef0"

// apiGateway is what API Gateway does behind its AWS_IAM authorizer, once
// the signature checked out (sigV4Plane): the request becomes a payload 2.0
// event carrying the verified caller, here instance's role session, and the
// real router in IAM mode answers it through the Lambda handler.
func apiGateway(router http.Handler, instance string) http.Handler {
	fn := lambdahttp.Handler(router)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, err := lambdahttp.Event(r, r.Method+" "+r.URL.Path, nil, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{
				UserARN: "arn:aws:sts::123456789012:assumed-role/lakeshore-fleet/" + instance}}
		resp, err := fn(r.Context(), ev)
		if err == nil {
			err = lambdahttp.WriteResponse(w, resp)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
	})
}

// TestIAMCredentialsCached: concurrent and sequential requests share one
// fetch of the role credentials (and one IMDSv2 token).
func TestIAMCredentialsCached(t *testing.T) {
	f := newIAMIMDS(t, "us-east-2")
	plane := newSigV4Plane(t, "us-east-2", nil)
	cfg, err := iamTestConfig(t, plane.URL, f.URL).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(plane.URL, "worker-tok", client.WithHTTPClient(cfg.HTTP))
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
	if n := len(plane.check(t)); n != 12 {
		t.Fatalf("%d requests arrived, want 12", n)
	}
	if n, l := f.credGETs.Load(), f.roleLists.Load(); n != 1 || l != 1 {
		t.Errorf("credentials fetched %d times (role listed %d) for 12 requests; want once", n, l)
	}
	if n := f.tokenPUTs.Load(); n != 1 {
		// The region at start and the credentials share one IMDS client
		// and so one session token.
		t.Errorf("%d IMDSv2 token PUTs, want 1", n)
	}
}

// TestIAMNoRegion: IAM mode against a host that names no region, with no
// --iam-region and no region from IMDS, fails at New and says what to do.
func TestIAMNoRegion(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	tests := []struct {
		name string
		imds func(t *testing.T) string
	}{
		{"imds without a region", func(t *testing.T) string { return newIAMIMDS(t, "").URL }},
		{"imds down", func(*testing.T) string { return down.URL }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := iamTestConfig(t, "https://lakeshore.example.com/prod", tt.imds(t))
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), "pass --iam-region") || !strings.Contains(err.Error(), "lakeshore.example.com") {
				t.Fatalf("New: %v; want an error naming --iam-region", err)
			}
		})
	}
}

// TestIAMRegionSources: --iam-region wins, then an execute-api host, then
// IMDS; only the last asks IMDS.
func TestIAMRegionSources(t *testing.T) {
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
			f := newIAMIMDS(t, "sa-east-1")
			got, _, err := iamRegion(context.Background(), tt.flag, tt.url, newIAMIMDSClient(f.URL))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("region %q, %v; want %q", got, err, tt.want)
			}
			if asked := f.regions.Load() > 0; asked != tt.imdsAsked {
				t.Errorf("IMDS asked: %v, want %v", asked, tt.imdsAsked)
			}
		})
	}
}

// TestIAMConfig: the settings around --iam.
func TestIAMConfig(t *testing.T) {
	f := newIAMIMDS(t, "")
	t.Run("region without iam", func(t *testing.T) {
		cfg := iamTestConfig(t, "http://127.0.0.1:1", f.URL)
		cfg.IAM, cfg.IAMRegion = false, "us-east-1"
		if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), "--iam-region is only used with --iam") {
			t.Fatalf("withDefaults: %v", err)
		}
	})
	t.Run("the caller's client is left alone", func(t *testing.T) {
		hc := &http.Client{Timeout: time.Second}
		cfg := iamTestConfig(t, "https://abc.execute-api.us-east-1.amazonaws.com", f.URL)
		cfg.HTTP = hc
		got, err := cfg.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if hc.Transport != nil || got.HTTP == hc || got.HTTP.Timeout != time.Second {
			t.Fatalf("caller's client changed or timeout lost: %+v → %+v", hc, got.HTTP)
		}
		if _, ok := got.HTTP.Transport.(*iamTransport); !ok {
			t.Fatalf("transport %T, want *iamTransport", got.HTTP.Transport)
		}
		if f.regions.Load() != 0 || f.credGETs.Load() != 0 {
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
			got, err := iamIMDSEndpoint(tt.configured, func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("%q %v, want %q", got, err, tt.want)
			}
		})
	}
}

// TestIAMSignsOnlyForTheControlPlane: a redirect to another host is
// neither signed nor sent (it would carry the role's session token).
func TestIAMSignsOnlyForTheControlPlane(t *testing.T) {
	f := newIAMIMDS(t, "us-east-1")
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	cfg, err := iamTestConfig(t, redirect.URL, f.URL).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.New(redirect.URL, "tok", client.WithHTTPClient(cfg.HTTP)).Poll(context.Background(), wire.PollRequest{})
	if err == nil || !strings.Contains(err.Error(), "not signing a request to") {
		t.Fatalf("poll through a cross-host redirect: %v", err)
	}
	if elsewhere.Load() != 0 {
		t.Error("the redirect target was contacted")
	}
}

// TestIAMMoveToken: only a bearer token moves; any Authorization goes.
func TestIAMMoveToken(t *testing.T) {
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

// TestIAMCredentialsErrorIsClear: no role on the instance fails the
// request with an error that says where credentials were sought, and never
// reaches the control plane.
func TestIAMCredentialsErrorIsClear(t *testing.T) {
	imdsSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
			_, _ = io.WriteString(w, iamTestIMDSv2)
			return
		}
		http.NotFound(w, r) // no instance profile
	}))
	defer imdsSrv.Close()
	plane := newSigV4Plane(t, "us-east-1", nil)
	cfg := iamTestConfig(t, plane.URL, imdsSrv.URL)
	cfg.IAMRegion = "us-east-1"
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.New(plane.URL, "secret-tok", client.WithHTTPClient(cfg.HTTP)).Poll(context.Background(), wire.PollRequest{})
	if err == nil || !strings.Contains(err.Error(), "instance role credentials from IMDS") || strings.Contains(err.Error(), "secret-tok") {
		t.Fatalf("poll: %v", err)
	}
	if !client.Retryable(err) {
		t.Errorf("a credentials failure should be retryable (IMDS may answer later): %v", err)
	}
	if n := len(plane.check(t)); n != 0 {
		t.Errorf("%d unsigned requests reached the control plane", n)
	}
}
