package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fakeDist makes a dist directory whose bootstraps are copies of one real
// static binary (the rie package's test function) built for goarch.
func fakeDist(t *testing.T, goarch string, functions ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fn")
	build := exec.Command("go", "build", "-o", bin, "../../server/rie/testdata/fn")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	for _, fn := range functions {
		if err := os.MkdirAll(filepath.Join(dist, fn), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dist, fn, "bootstrap"), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dist
}

var allFunctions = []string{"hello", "poll", "ack", "bye", "api", "reaper", "hoststatus", "wake", "provisioner"}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestGatewayRoutesFromTemplate: the gateway's routes are template.yaml's
// HttpApi events, literal segments preferred over {params}, as API Gateway
// chooses; a greedy {proxy+} takes one segment or more.
func TestGatewayRoutesFromTemplate(t *testing.T) {
	g, err := newLambdaGateway(lambdaConfig{dist: fakeDist(t, runtime.GOARCH, allFunctions...), emulator: "/bin/true"}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	for _, tc := range []struct {
		method, path, fn string
		params           map[string]string
	}{
		{"POST", "/v1/daemon/hello", "hello", nil},
		{"POST", "/v1/daemon/poll", "poll", nil},
		{"POST", "/v1/daemon/ack", "ack", nil},
		{"POST", "/v1/daemon/bye", "bye", nil},
		{"POST", "/v1/invocations", "api", nil},
		{"GET", "/v1/invocations/inv_1", "api", map[string]string{"id": "inv_1"}},
		{"POST", "/v1/invocations/inv_1/cancel", "api", map[string]string{"id": "inv_1"}},
		{"GET", "/v1/workers/wrk_1/setup-results", "api", map[string]string{"id": "wrk_1"}},
		{"GET", "/v1/queues/q.a", "api", map[string]string{"queue": "q.a"}},
		{"GET", "/v1/healthz", "api", nil},
		{"GET", "/ui", "api", nil},
		{"GET", "/ui/live", "api", map[string]string{"proxy": "live"}},
		{"GET", "/ui/static/app.css", "api", map[string]string{"proxy": "static/app.css"}},
		{"POST", "/ui/invocations/inv_1/cancel", "api", map[string]string{"proxy": "invocations/inv_1/cancel"}},
		{"GET", "/v1/daemon/hello", "", nil},
		{"POST", "/v1/queues/q", "", nil},
		{"GET", "/v1/invocations//cancel", "", nil},
		{"GET", "/nope", "", nil},
	} {
		rt, params, ok := g.match(tc.method, tc.path)
		if ok != (tc.fn != "") || rt.fn != tc.fn || len(params) != len(tc.params) {
			t.Errorf("%s %s: fn %q params %v ok %v; want fn %q params %v", tc.method, tc.path, rt.fn, params, ok, tc.fn, tc.params)
			continue
		}
		for k, v := range tc.params {
			if params[k] != v {
				t.Errorf("%s %s: param %s = %q, want %q", tc.method, tc.path, k, params[k], v)
			}
		}
	}
	if len(g.pools) != len(allFunctions) {
		t.Errorf("pools for %d functions, want %d", len(g.pools), len(allFunctions))
	}
}

// TestGatewayRefusesWrongBuilds: a missing bootstrap or one built for
// another architecture is refused at start with the make command to run.
func TestGatewayRefusesWrongBuilds(t *testing.T) {
	_, err := newLambdaGateway(lambdaConfig{dist: fakeDist(t, runtime.GOARCH, "hello"), emulator: "/bin/true"}, quietLog())
	if err == nil || !strings.Contains(err.Error(), "poll/bootstrap") || !strings.Contains(err.Error(), "make lambdas LAMBDA_ARCH="+runtime.GOARCH) {
		t.Errorf("missing bootstraps: %v", err)
	}
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	_, err = newLambdaGateway(lambdaConfig{dist: fakeDist(t, other, allFunctions...), emulator: "/bin/true"}, quietLog())
	if err == nil || !strings.Contains(err.Error(), "built for "+other) || !strings.Contains(err.Error(), "make lambdas LAMBDA_ARCH="+runtime.GOARCH) {
		t.Errorf("bootstraps for %s: %v", other, err)
	}
}

// TestLambdaEnv: functions get this server's configuration, none of the
// caller's own LAKESHORE_ settings, and on the embedded store an SDK
// configuration that reaches it whatever the caller's AWS settings.
func TestLambdaEnv(t *testing.T) {
	o := devOptions{tablePrefix: "p-", enrollToken: "e", operatorToken: "o", staleAfter: 3 * time.Second}
	env := lambdaEnv([]string{"PATH=/bin", "LAKESHORE_ENROLL_TOKEN_PARAM=/x", "AWS_PROFILE=prod"}, o, "http://127.0.0.1:1", "", wakeChannel{})
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v // later entries win, as in exec
	}
	want := map[string]string{"PATH": "/bin", "LAKESHORE_TABLE_PREFIX": "p-", "LAKESHORE_ENROLL_TOKEN": "e",
		"LAKESHORE_OPERATOR_TOKEN": "o", "LAKESHORE_STALE_AFTER": "3s", "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_PROFILE": ""}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["LAKESHORE_ENROLL_TOKEN_PARAM"]; ok {
		t.Error("the caller's LAKESHORE_ENROLL_TOKEN_PARAM reached the functions")
	}
}

// TestDevRefusesShortTokensOnARoutableAddress: `lakeshore dev` on an
// address other machines reach refuses a short token (before it listens
// or opens a store); on loopback any token is taken.
func TestDevRefusesShortTokensOnARoutableAddress(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", "192.0.2.1:3000"} {
		err := runDev(context.Background(), devOptions{addr: addr, storeKind: "embedded", tablePrefix: "p-",
			enrollToken: "e", operatorToken: "o-but-long-enough-1234", staleAfter: time.Minute, logLevel: "error", claimShards: 1})
		if err == nil || !strings.Contains(err.Error(), "--enroll-token is 1 bytes") {
			t.Errorf("%s: %v, want the short token refused", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:3000", "[::1]:3000", "localhost:3000"} {
		if !loopbackAddr(addr) {
			t.Errorf("%s is loopback", addr)
		}
	}
	for _, addr := range []string{"0.0.0.0:3000", "10.0.0.5:3000", ":3000", "example.com:3000"} {
		if loopbackAddr(addr) {
			t.Errorf("%s is not loopback", addr)
		}
	}
}
