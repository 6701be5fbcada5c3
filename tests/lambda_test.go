package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dreamlake/lakeshore/server/rie"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// rieBin finds the Lambda Runtime Interface Emulator (`make test` installs
// it with go install). Missing: skip, or fail under CI=true.
func rieBin(t testing.TB) string {
	t.Helper()
	p, err := rie.Find()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return p
}

// lambdaFn is one bootstrap running under the emulator.
type lambdaFn struct {
	pool *rie.Pool
	size int64
}

// lambdaFunctions are the functions/ directories, as `make lambdas` names them.
var lambdaFunctions = []string{"hello", "poll", "ack", "bye", "api", "reaper", "hoststatus", "wake", "provisioner"}

var buildLambdas = sync.OnceValue(func() error {
	for _, name := range lambdaFunctions {
		build := exec.Command("go", "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w",
			"-o", filepath.Join(binDir, "dist", name, "bootstrap"), "../functions/"+name)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", name, err, out)
		}
	}
	return nil
})

// lambdaDist builds every function as a static bootstrap for this machine,
// once per test binary, in the layout `make lambdas` makes
// (<dist>/<function>/bootstrap), and returns the directory.
func lambdaDist(t testing.TB) string {
	t.Helper()
	if err := buildLambdas(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(binDir, "dist")
}

// lambdasBackend runs `lakeshore dev --lambdas`: every route through the
// real bootstraps under the emulator, over the embedded store.
var lambdasBackend = backend{"lambdas", func(t testing.TB) ([]string, []string) {
	rieBin(t) // skip, or fail under CI, without the emulator
	return []string{"--store", "embedded", "--lambdas", lambdaDist(t)}, nil
}}

// planes are the ways the agent suite reaches the control plane: the
// router in process, and the real Lambda path (sam local start-api's).
var planes = []backend{backends[0], lambdasBackend}

// forEachPlane runs fn as a subtest on each plane.
func forEachPlane(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, b := range planes {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

// startLambda runs functions/<name>, built for this machine, under
// aws-lambda-rie on free loopback ports; its output is logged if t fails.
func startLambda(t *testing.T, name string, env []string) *lambdaFn {
	t.Helper()
	bootstrap := filepath.Join(lambdaDist(t), name, "bootstrap")
	st, err := os.Stat(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	pool, err := rie.NewPool(rie.Function{Name: name, Bootstrap: bootstrap, Emulator: rieBin(t),
		Env: append(os.Environ(), env...), MaxConcurrency: 1, Logs: logs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if t.Failed() {
			t.Logf("%s under aws-lambda-rie:\n%s", name, logs.String())
		}
	})
	return &lambdaFn{pool: pool, size: st.Size()}
}

// invoke sends one event and returns the function's answer; a function
// error fails the test.
func (fn *lambdaFn) invoke(t *testing.T, event any) []byte {
	t.Helper()
	body, _ := json.Marshal(event)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := fn.pool.Invoke(ctx, body)
	if err != nil {
		t.Fatalf("invoke: %v", err)
	}
	return out
}

// route sends an API Gateway v2 event and decodes the HTTP answer into v.
func (fn *lambdaFn) route(t *testing.T, method, path, token string, body any, v any) int {
	t.Helper()
	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: path, Headers: map[string]string{"content-type": "application/json"}}
	ev.RequestContext.HTTP.Method, ev.RequestContext.HTTP.Path, ev.RequestContext.HTTP.SourceIP = method, path, "127.0.0.1"
	if token != "" {
		ev.Headers["authorization"] = "Bearer " + token
	}
	if body != nil {
		b, _ := json.Marshal(body)
		ev.Body = string(b)
	}
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(fn.invoke(t, ev), &resp); err != nil {
		t.Fatalf("%s %s: not an API Gateway answer: %v", method, path, err)
	}
	if v != nil && resp.Body != "" {
		if err := json.Unmarshal([]byte(resp.Body), v); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, path, resp.Body, err)
		}
	}
	return resp.StatusCode
}

// initMS reports the INIT duration the emulator logged.
func (fn *lambdaFn) initMS() string {
	if ms := fn.pool.Stats().InitMS; len(ms) > 0 {
		return strconv.FormatFloat(ms[0], 'f', 1, 64)
	}
	return "?"
}

// TestLambdasUnderTheRuntimeEmulator runs every real bootstrap under
// aws-lambda-rie (what `sam local` runs in its container) against moto, with
// tables created from template.yaml, and walks one agent's life through the
// route functions: hello → submit → poll claims → ack → bye; then the
// reaper and the host poller answer scheduled and EC2 events.
func TestLambdasUnderTheRuntimeEmulator(t *testing.T) {
	endpoint := storetest.MotoEndpoint(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(context.Background(), storetest.Client(endpoint), prefix); err != nil {
		t.Fatal(err)
	}
	const enroll, operator = "lambda-enroll", "lambda-operator"
	env := []string{"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test",
		"AWS_SECRET_ACCESS_KEY=test", "LAKESHORE_TABLE_PREFIX=" + prefix, "LAKESHORE_STALE_AFTER=60s",
		"LAKESHORE_ENROLL_TOKEN=" + enroll, "LAKESHORE_OPERATOR_TOKEN=" + operator}
	fns := map[string]*lambdaFn{}
	for _, name := range lambdaFunctions {
		fns[name] = startLambda(t, name, env)
	}

	var hello wire.HelloResponse
	if code := fns["hello"].route(t, "POST", "/v1/daemon/hello", enroll, wire.HelloRequest{MachineID: "m", BootID: "b"}, &hello); code != 200 {
		t.Fatalf("hello: %d", code)
	}
	var inv wire.Invocation
	if code := fns["api"].route(t, "POST", "/v1/invocations", operator, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}}, &inv); code != 201 {
		t.Fatalf("submit: %d", code)
	}
	var poll wire.PollResponse
	if code := fns["poll"].route(t, "POST", "/v1/daemon/poll", hello.Token,
		wire.PollRequest{WorkerID: hello.WorkerID, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}}, &poll); code != 200 ||
		len(poll.Commands) != 1 || poll.Commands[0].Invocation.InvocationID != inv.InvocationID {
		t.Fatalf("poll: %d %+v", code, poll)
	}
	var ack wire.AckResponse
	if code := fns["ack"].route(t, "POST", "/v1/daemon/ack", hello.Token, wire.AckRequest{WorkerID: hello.WorkerID,
		InvocationID: inv.InvocationID, Attempt: 1, State: wire.StateSucceeded}, &ack); code != 200 || !ack.Recorded {
		t.Fatalf("ack: %d %+v", code, ack)
	}
	if code := fns["bye"].route(t, "POST", "/v1/daemon/bye", hello.Token, wire.ByeRequest{WorkerID: hello.WorkerID, Reason: wire.ByeIdle}, nil); code != 204 {
		t.Fatalf("bye: %d", code)
	}
	var stats wire.QueueStats
	if code := fns["api"].route(t, "GET", "/v1/queues/q", operator, nil, &stats); code != 200 || stats.DoneCount != 1 {
		t.Fatalf("queue stats: %d %+v", code, stats)
	}
	var errBody wire.ErrorBody
	if code := fns["api"].route(t, "GET", "/v1/workers", "", nil, &errBody); code != 401 || errBody.Error.Code != wire.CodeUnauthorized {
		t.Fatalf("operator route without a token: %d %+v", code, errBody)
	}

	var sweep struct{ Workers, Lost, Requeued int }
	scheduled := map[string]any{"source": "aws.scheduler", "detail-type": "Scheduled Event", "detail": map[string]any{}}
	if err := json.Unmarshal(fns["reaper"].invoke(t, scheduled), &sweep); err != nil || sweep.Workers != 1 {
		t.Fatalf("reaper: %+v %v", sweep, err)
	}
	stateChange := map[string]any{"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification",
		"detail": map[string]any{"instance-id": "i-0123456789abcdef0", "state": "terminated"}}
	for _, ev := range []any{scheduled, stateChange} {
		fns["hoststatus"].invoke(t, ev) // a function error fails the test
	}
	// Provisioning is off here (no LAKESHORE_PROVISION_MAX_HOSTS): a pass
	// does nothing, and says so.
	var pass struct{ Launched, Failed, Ended int }
	if err := json.Unmarshal(fns["provisioner"].invoke(t, scheduled), &pass); err != nil || pass.Launched != 0 {
		t.Fatalf("provisioner: %+v %v", pass, err)
	}
	for _, name := range lambdaFunctions {
		t.Logf("%-10s bootstrap %5.1f MB  INIT %s ms", name, float64(fns[name].size)/1e6, fns[name].initMS())
	}
}

// daemonFunctions are the functions every daemon calls, each cold start
// on a daemon's path: they serve the daemon routes alone (daemonapi).
var daemonFunctions = []string{"hello", "poll", "ack", "bye"}

// maxDaemonBootstrap bounds a daemon function's bootstrap (-s -w, as `make
// lambdas` builds it): what Lambda loads before INIT, and a measure of what
// it links.
const maxDaemonBootstrap = 15_000_000

// TestDaemonBootstrapsAreLean: hello, poll, ack and bye, built as `make
// lambdas` builds them for this machine, are each at most 15 MB. An arm64
// deploy build is smaller than an amd64 one, so on this machine the bound
// is at least as strict as the deploy target. (What they may not link is
// `make check`'s rule; this catches the weight of what they may.)
func TestDaemonBootstrapsAreLean(t *testing.T) {
	dist := lambdaDist(t)
	for _, name := range daemonFunctions {
		st, err := os.Stat(filepath.Join(dist, name, "bootstrap"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > maxDaemonBootstrap {
			t.Errorf("functions/%s: bootstrap is %.1f MB, over %.0f MB (go tool nm -size -sort size shows what it links)",
				name, float64(st.Size())/1e6, float64(maxDaemonBootstrap)/1e6)
		}
	}
}

// BenchmarkLambdaColdStart measures each bootstrap's cold start under the
// emulator (the INIT duration of its INIT REPORT line) and its size, for
// `make bench`; targets: ≤ 15 MB and INIT ≤ 30 ms for the daemon
// functions. Each iteration starts a fresh emulator and answers one event
// against the embedded store: a daemon function its own route (refused,
// without a token), the api function the health check, the others a
// scheduled event.
func BenchmarkLambdaColdStart(b *testing.B) {
	emulator := rieBin(b)
	endpoint := storetest.EmbeddedEndpoint(b)
	prefix := storetest.Prefix(b)
	if err := schema.EnsureTables(context.Background(), storetest.Client(endpoint), prefix); err != nil {
		b.Fatal(err)
	}
	env := append(os.Environ(), "AWS_ENDPOINT_URL="+endpoint, "AWS_REGION="+storetest.Region, "AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local", "AWS_EC2_METADATA_DISABLED=true", "LAKESHORE_TABLE_PREFIX="+prefix,
		"LAKESHORE_ENROLL_TOKEN=bench-enroll", "LAKESHORE_OPERATOR_TOKEN=bench-operator")
	scheduled, _ := json.Marshal(map[string]any{"source": "aws.scheduler", "detail-type": "Scheduled Event", "detail": map[string]any{}})
	healthz := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/v1/healthz"}
	healthz.RequestContext.HTTP.Method, healthz.RequestContext.HTTP.Path = "GET", "/v1/healthz"
	route, _ := json.Marshal(healthz)
	for _, name := range lambdaFunctions {
		b.Run(name, func(b *testing.B) {
			bootstrap := filepath.Join(lambdaDist(b), name, "bootstrap")
			st, err := os.Stat(bootstrap)
			if err != nil {
				b.Fatal(err)
			}
			event := route
			switch name {
			case "reaper", "hoststatus", "provisioner":
				event = scheduled
			case "hello", "poll", "ack", "bye":
				own := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: "/v1/daemon/" + name}
				own.RequestContext.HTTP.Method, own.RequestContext.HTTP.Path = "POST", own.RawPath
				event, _ = json.Marshal(own)
			}
			var inits []float64
			for b.Loop() {
				pool, err := rie.NewPool(rie.Function{Name: name, Bootstrap: bootstrap, Emulator: emulator, Env: env, MaxConcurrency: 1})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := pool.Invoke(context.Background(), event); err != nil {
					b.Fatalf("%s: %v", name, err)
				}
				inits = append(inits, pool.Stats().InitMS...)
				pool.Close()
			}
			slices.Sort(inits)
			if len(inits) > 0 {
				b.ReportMetric(inits[len(inits)/2], "init-ms-p50")
				b.ReportMetric(inits[len(inits)-1], "init-ms-max")
			}
			b.ReportMetric(float64(st.Size())/1e6, "MB")
		})
	}
}
