package agent

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dreamlake/lakeshore/agent/internal/imds/imdstest"
	"github.com/dreamlake/lakeshore/agent/internal/sigv4/sigv4test"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/lambdahttp"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The agent in IAM mode; the signing itself is agent/internal/sigv4's, and
// tested there.

// TestIAMAgentEndToEnd runs an IAM-mode agent against the real router
// behind a verifying stand-in for API Gateway: hello, poll, ack and bye all
// arrive signed with the instance role's credentials, fetched from IMDS
// once.
func TestIAMAgentEndToEnd(t *testing.T) {
	p := apitest.New(t, func(c *apitest.Config) { c.DaemonAuth = auth.DaemonAuthIAM })
	f := imdstest.New(t, imdstest.State{Region: "ap-southeast-2"})
	plane := sigv4test.NewPlane(t, "ap-southeast-2", apiGateway(p.Handler, iamTestInstance))
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
	for _, s := range plane.Check(t) {
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
	if n, l := f.CredGETs.Load(), f.RoleLists.Load(); n != 1 || l != 1 {
		t.Errorf("credentials fetched %d times (role listed %d) for %d requests; want once", n, l, len(plane.Check(t)))
	}
}

// iamTestInstance is the instance the fake role session belongs to.
const iamTestInstance = "i-0123456789abcdef0"

// apiGateway is what API Gateway does behind its AWS_IAM authorizer, once
// the signature checked out (sigv4test.Plane): the request becomes a payload 2.0
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

// TestIAMAgentSignsItsWakeSocket: an IAM-mode agent whose hello offers a
// wake channel opens its socket with the upgrade signed by the instance
// role for the wake channel's host (the loop's wiring of sigv4.WakeClient),
// as a front re-verifying each upgrade the way API Gateway's AWS_IAM
// authorization would sees. (Whether the socket then comes up is
// agent/internal/wakeclient's and sigv4's to test.)
func TestIAMAgentSignsItsWakeSocket(t *testing.T) {
	front := sigv4test.NewPlane(t, "ap-southeast-2", nil) // verifies, then refuses the upgrade
	p := apitest.New(t, func(c *apitest.Config) {
		c.DaemonAuth = auth.DaemonAuthIAM
		c.Control.WakeURL, c.Control.Poster = front.WebSocketURL("/wake"), nopPoster{}
	})
	f := imdstest.New(t, imdstest.State{Region: "ap-southeast-2"})
	plane := sigv4test.NewPlane(t, "ap-southeast-2", apiGateway(p.Handler, iamTestInstance))
	cfg := iamTestConfig(t, plane.URL, f.URL)
	cfg.MachineID = iamTestInstance
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	waittest.Until(t, 30*time.Second, "the wake socket's upgrade", func() bool { return front.Requests() > 0 })
	for _, up := range front.Check(t) {
		if up.Path != "/wake" || up.Token == "" {
			t.Errorf("the wake front saw %s with token %q; want the upgrade at /wake with the worker token", up.Path, up.Token)
		}
	}
	plane.Check(t)
}

// TestIAMConfig: the settings around --iam.
func TestIAMConfig(t *testing.T) {
	f := imdstest.New(t, imdstest.State{})
	t.Run("region without iam", func(t *testing.T) {
		cfg := iamTestConfig(t, "http://127.0.0.1:1", f.URL)
		cfg.IAM, cfg.IAMRegion = false, "us-east-1"
		if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), "--iam-region is only used with --iam") {
			t.Fatalf("withDefaults: %v", err)
		}
	})
	t.Run("--iam-region is the region signed for", func(t *testing.T) {
		plane := sigv4test.NewPlane(t, "us-west-2", nil)
		cfg := iamTestConfig(t, plane.URL, f.URL) // neither the host nor IMDS names a region
		cfg.IAMRegion = "us-west-2"
		got, err := cfg.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.New(plane.URL, "tok", client.WithHTTPClient(got.HTTP)).Poll(context.Background(), wire.PollRequest{}); err != nil {
			t.Fatalf("poll: %v", err)
		}
		if n := len(plane.Check(t)); n != 1 {
			t.Fatalf("%d requests reached the control plane, want 1", n)
		}
	})
	t.Run("a signing copy of the caller's client", func(t *testing.T) {
		hc := &http.Client{Timeout: time.Second}
		cfg := iamTestConfig(t, "https://abc.execute-api.us-east-1.amazonaws.com", f.URL)
		cfg.HTTP = hc
		got, err := cfg.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if hc.Transport != nil || got.HTTP == hc || got.HTTP.Transport == nil || got.HTTP.Timeout != time.Second {
			t.Fatalf("caller's client changed, or not copied with its timeout: %+v → %+v", hc, got.HTTP)
		}
	})
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
