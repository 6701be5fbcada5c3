// Package tests holds integration tests across processes: the real
// `lakeshore dev` binary (and later nymph) on loopback ports, over the
// embedded store and over moto_server.
package tests

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/client"
)

var binDir string

func TestMain(m *testing.M) {
	if upstream := os.Getenv(fleetStoreEnv); upstream != "" {
		os.Exit(serveFleetStore(upstream))
	}
	dir, err := os.MkdirTemp("", "lakeshore-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "tests: temp dir:", err)
		os.Exit(2)
	}
	defer os.RemoveAll(dir)
	// Other users (--run-as bodies) run some of what is built here.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "tests: temp dir:", err)
		os.Exit(2)
	}
	binDir = dir
	parallelByDefault(testParallel)
	storetest.Main(m)
	if err := writeFaultReport(); err != nil {
		fmt.Fprintln(os.Stderr, "tests:", err)
		os.Exit(1)
	}
}

// testParallel is how many of this package's parallel tests run at once
// unless -parallel says otherwise. Those that call t.Parallel mostly wait
// on real clocks (poll intervals, keep-alives, graces, a daemon's hello
// backoff, the browser's 2 s refreshes) more than they compute, so more of
// them than the machine has cores share it well. Every invariant they
// check holds under any timing (the fault table's: nothing lost, nothing
// counted twice), and their clock bounds are generous. Serial still: the
// drain notice's 2 s bound (TestBodiesSeeTheLifecycle), the fleet smoke
// test (CPU), and the fault that restarts a control plane on a port it
// freed (TestFaultControlPlaneRestart).
const testParallel = 4

// parallelByDefault sets -test.parallel to n when the command line did not.
func parallelByDefault(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}

var buildOnce = sync.OnceValue(func() error {
	out, err := exec.Command("go", "build", "-o", binDir, "../cli/lakeshore", "../agent/cmd/nymph", "../examples/lifecycle/checkpoint", "./testdata/peek").CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
})

// bin builds bin/lakeshore and bin/nymph once per test binary and returns
// the path of name.
func bin(t testing.TB, name string) string {
	t.Helper()
	if err := buildOnce(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(binDir, name)
}

func lakeshoreBin(t testing.TB) string { return bin(t, "lakeshore") }

// devServer is a running `lakeshore dev` process.
type devServer struct {
	URL           string
	EnrollToken   string
	OperatorToken string
	// WakeSecret is what a call to its wake management API must carry
	// (wire.WakeSecretHeader).
	WakeSecret string
	cmd        *exec.Cmd
	logs       *strings.Builder
	exited     chan struct{}
	// logText reads what the process logged so far (safe while it runs).
	logText func() string
}

// stop ends the process (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (d *devServer) stop(t testing.TB) {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	}
}

// Operator returns a client holding the operator token.
func (d *devServer) Operator() *client.Client { return client.New(d.URL, d.OperatorToken) }

// Enroll returns a client holding the enrollment token.
func (d *devServer) Enroll() *client.Client { return client.New(d.URL, d.EnrollToken) }

// backend names a store `lakeshore dev` can run on in tests.
type backend struct {
	name string
	// args and env for `lakeshore dev`; nil for the embedded store.
	setup func(t testing.TB) (args, env []string)
}

var backends = []backend{
	{"embedded", func(t testing.TB) ([]string, []string) { return []string{"--store", "embedded"}, nil }},
	{"moto", func(t testing.TB) ([]string, []string) {
		endpoint := storetest.MotoEndpoint(t)
		return []string{"--store", "aws", "--table-prefix", storetest.Prefix(t)}, []string{
			"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=us-east-1",
			"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true",
		}
	}},
}

// ranAFunction matches the log prefix of a function run under the emulator.
var ranAFunction = regexp.MustCompile(`\[[a-z]+#1\]`)

// startDev runs `lakeshore dev` on a free loopback port and waits until it
// prints its address and tokens. It is stopped with SIGTERM when t ends.
func startDev(t testing.TB, b backend, extra ...string) *devServer {
	t.Helper()
	args, env := b.setup(t)
	args = append(append([]string{"dev", "--addr", "127.0.0.1:0", "--log-level", "debug"}, args...), extra...)
	cmd := exec.Command(lakeshoreBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logs := &strings.Builder{}
	var mu sync.Mutex
	cmd.Stderr = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) })
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start lakeshore dev: %v", err)
	}
	d := &devServer{cmd: cmd, logs: logs}
	d.logText = func() string { mu.Lock(); defer mu.Unlock(); return logs.String() }
	if slices.Contains(args, "--lambdas") {
		// The Lambda path must really have been taken: each cold start
		// logs the emulator's INIT REPORT, and a function ran (its log
		// lines carry "[<function>#<instance>]").
		t.Cleanup(func() {
			mu.Lock()
			defer mu.Unlock()
			if !strings.Contains(logs.String(), "INIT REPORT") || !ranAFunction.MatchString(logs.String()) {
				t.Errorf("lakeshore dev --lambdas: no function ran under the emulator")
			}
		})
	}
	d.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		d.stop(t)
		if t.Failed() {
			mu.Lock()
			t.Logf("lakeshore dev log:\n%s", logs.String())
			mu.Unlock()
		}
	})
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), "=")
			switch k {
			case "LAKESHORE_URL":
				d.URL = v
			case "LAKESHORE_ENROLL_TOKEN":
				d.EnrollToken = v
			case "LAKESHORE_WAKE_SECRET":
				d.WakeSecret = v
			case "LAKESHORE_TOKEN":
				d.OperatorToken = v
				ready <- nil
			}
		}
		ready <- fmt.Errorf("lakeshore dev exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("%v; log:\n%s", err, d.logText())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("lakeshore dev not ready after 30s; log:\n%s", d.logText())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := d.Operator().Healthz(ctx); err != nil {
		t.Fatalf("healthz: %v", err)
	}
	return d
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
