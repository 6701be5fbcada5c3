// Package storetest starts DynamoDB endpoints for tests: the embedded
// minidyn server, a shared moto_server, and a single-threaded moto. Every
// one is reached through the same SDK client (Client), as the product
// reaches real DynamoDB.
//
// The moto servers are started once per test binary and shared; give each
// test its own table prefix (Prefix) so tests do not collide. To stop them
// when the binary ends, add
//
//	func TestMain(m *testing.M) { storetest.Main(m) }
//
// Without it they are still killed when the test process exits (parent-death
// signal), but Main also stops them cleanly.
//
// # Another emulator instead of moto
//
// When the environment variable LAKESHORE_TEST_AWS_ENDPOINT (EndpointEnv)
// holds a URL such as http://127.0.0.1:4566, MotoEndpoint and Moto return that
// endpoint instead of starting moto_server: `make localstack-test` runs the
// integration suite this way against LocalStack. Sharing one endpoint is fine
// because every test uses its own table prefix. The endpoint must answer (a
// test fails, never skips, when it does not) and must serve what the test
// calls on it: DynamoDB, and for some tests EC2 and SSM.
//
// MotoSingleThreaded ignores the variable and always starts its own
// single-threaded moto: its promise, that every call is atomic, holds only for
// the server it starts, and the race tests that use it are about the store,
// not about the emulator.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/embedded"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// Region is the AWS region every test client uses.
const Region = store.EmbeddedRegion

// motoStartTimeout bounds how long a moto server may take to answer.
const motoStartTimeout = 20 * time.Second

// Client returns a DynamoDB client for an emulator endpoint; see
// store.EndpointClient.
func Client(endpoint string) *dynamodb.Client {
	return store.EndpointClient(endpoint)
}

// Prefix returns a fresh table prefix such as "t3f9a1c0b2d4e-", unique to
// this call, so tests sharing one emulator never see each other's tables.
func Prefix(t testing.TB) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("storetest: random prefix: %v", err)
	}
	return "t" + hex.EncodeToString(b[:]) + "-"
}

// Embedded returns a client for a new, empty minidyn server (the embedded
// store of `lakeshore dev`), stopped when the test ends.
func Embedded(t testing.TB) *dynamodb.Client {
	t.Helper()
	return Client(EmbeddedEndpoint(t))
}

// EmbeddedEndpoint starts a new, empty minidyn server on 127.0.0.1 and
// returns its URL; the server stops when the test ends. Use it to point
// another process (or AWS_ENDPOINT_URL) at the embedded store.
func EmbeddedEndpoint(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(embedded.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// Moto returns a client for the moto_server shared by this test binary.
// See MotoEndpoint.
func Moto(t testing.TB) *dynamodb.Client {
	t.Helper()
	return Client(MotoEndpoint(t))
}

// MotoEndpoint returns the URL of a moto_server (moto 5, from PATH) on a
// loopback port, started on first use and shared by the whole test binary.
// moto_server serves requests on several threads without locking its
// DynamoDB backend: for tests of concurrent conditional writes use
// MotoSingleThreaded or Embedded instead.
//
// If EndpointEnv is set, MotoEndpoint returns its URL instead and starts
// nothing; the test fails if the URL is malformed or nothing answers there.
//
// If moto_server is not installed the test is skipped, or fails when the
// environment has CI=true.
func MotoEndpoint(t testing.TB) string {
	t.Helper()
	if endpoint, err := ExternalEndpoint(); err != nil {
		t.Fatalf("storetest: %v", err)
	} else if endpoint != "" {
		if err := probeExternal(endpoint); err != nil {
			t.Fatalf("storetest: %s=%s: %v", EndpointEnv, endpoint, err)
		}
		return endpoint
	}
	return motoShared.endpoint(t, func() ([]string, error) {
		bin, err := exec.LookPath("moto_server")
		if err != nil {
			return nil, errMissing{fmt.Errorf("moto_server not found on PATH: %w", err)}
		}
		return []string{bin, "-H", "127.0.0.1", "-p"}, nil
	})
}

// MotoSingleThreaded returns the URL of a moto server that handles one
// request at a time (tests/moto_single.py run by python3 from PATH), started
// on first use and shared by the whole test binary. On it every DynamoDB call
// is atomic, so races between conditional writes behave as on real DynamoDB.
// It ignores EndpointEnv (see the package documentation).
//
// If python3 or moto is not installed the test is skipped, or fails when the
// environment has CI=true.
func MotoSingleThreaded(t testing.TB) string {
	t.Helper()
	return motoSingle.endpoint(t, func() ([]string, error) {
		py, err := exec.LookPath("python3")
		if err != nil {
			return nil, errMissing{fmt.Errorf("python3 not found on PATH: %w", err)}
		}
		root, err := moduleRoot()
		if err != nil {
			return nil, err
		}
		script := filepath.Join(root, "tests", "moto_single.py")
		if _, err := os.Stat(script); err != nil {
			return nil, fmt.Errorf("single-threaded moto script: %w", err)
		}
		return []string{py, script, "-H", "127.0.0.1", "-p"}, nil
	})
}

// EndpointEnv names the environment variable that points MotoEndpoint at an
// emulator that is already running, such as LocalStack, instead of moto.
const EndpointEnv = "LAKESHORE_TEST_AWS_ENDPOINT"

// externalProbeTimeout bounds the first check that the endpoint of
// EndpointEnv answers.
const externalProbeTimeout = 10 * time.Second

// ExternalEndpoint reports the endpoint URL EndpointEnv holds, without a
// trailing slash, or "" when the variable is unset or empty. It returns an
// error for a value that is not an http:// or https:// URL with a host and no
// path beyond "/".
func ExternalEndpoint() (string, error) {
	raw := strings.TrimSpace(os.Getenv(EndpointEnv))
	if raw == "" {
		return "", nil
	}
	u, err := url.Parse(raw)
	if err == nil && ((u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil) {
		err = errors.New("not an http:// or https:// URL of a host")
	}
	if err != nil {
		return "", fmt.Errorf("%s=%q: want a URL such as http://127.0.0.1:4566 (%w)", EndpointEnv, raw, err)
	}
	return u.Scheme + "://" + u.Host, nil
}

// externalProbes remembers, per endpoint, whether it answered, so a test
// binary probes each endpoint once.
var externalProbes sync.Map // endpoint URL → func() error

// probeExternal reports whether something answers HTTP at endpoint (any
// status will do: emulators answer "/" differently).
func probeExternal(endpoint string) error {
	probe, _ := externalProbes.LoadOrStore(endpoint, sync.OnceValue(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), externalProbeTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/", nil)
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Timeout: externalProbeTimeout}).Do(req)
		if err != nil {
			return fmt.Errorf("no answer (is the emulator running?): %w", err)
		}
		resp.Body.Close()
		return nil
	}))
	return probe.(func() error)()
}

// Stop stops the shared moto servers, if any were started. A later
// MotoEndpoint or MotoSingleThreaded call in the same binary fails.
func Stop() {
	motoShared.stop()
	motoSingle.stop()
}

// Main runs the tests of a package and then stops the shared moto servers.
// Call it from TestMain; the test binary exits with m.Run's status.
func Main(m *testing.M) {
	defer Stop()
	m.Run()
}

// errMissing marks an emulator that is not installed on this machine.
type errMissing struct{ error }

func (e errMissing) Unwrap() error { return e.error }

// exitMissing is the status tests/moto_single.py exits with when moto is not
// installed.
const exitMissing = 3

// sharedMoto is one moto process shared by every test of a binary.
type sharedMoto struct {
	once    sync.Once
	mu      sync.Mutex
	url     string
	err     error
	proc    *motoProcess
	stopped bool
}

var motoShared, motoSingle sharedMoto

// endpoint starts the server on first use (argv from command, completed by
// a port number) and returns its URL, or skips or fails t.
func (s *sharedMoto) endpoint(t testing.TB, command func() ([]string, error)) string {
	t.Helper()
	s.once.Do(func() {
		argv, err := command()
		if err != nil {
			s.err = err
			return
		}
		proc, err := startMoto(argv)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.stopped {
			if proc != nil {
				proc.kill()
			}
			s.err = errors.New("storetest: moto servers already stopped")
			return
		}
		s.proc, s.err = proc, err
		if err == nil {
			s.url = proc.url
		}
	})
	if s.err != nil {
		if _, missing := errors.AsType[errMissing](s.err); missing && os.Getenv("CI") != "true" {
			t.Skipf("storetest: %v", s.err)
		}
		t.Fatalf("storetest: %v", s.err)
	}
	return s.url
}

func (s *sharedMoto) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// motoProcess is a running moto server.
type motoProcess struct {
	url    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has exited
	output *tailBuffer
}

// startMoto runs argv plus a free port, retrying on a new port if the
// process dies before answering (another process may have taken the port).
func startMoto(argv []string) (*motoProcess, error) {
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p, err := startMotoOnce(append(append([]string(nil), argv...), strconv.Itoa(port)), port)
		if err == nil {
			return p, nil
		}
		lastErr = err
		if _, missing := errors.AsType[errMissing](err); missing {
			break
		}
	}
	return nil, lastErr
}

func startMotoOnce(argv []string, port int) (*motoProcess, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	out := &tailBuffer{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "MOTO_PORT="+strconv.Itoa(port), "PYTHONUNBUFFERED=1")
	// Own process group, so kill takes any child with it (moto_server is a
	// pyenv shim); and SIGKILL if the test binary dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	p := &motoProcess{
		url:    "http://127.0.0.1:" + strconv.Itoa(port),
		cmd:    cmd,
		exited: make(chan struct{}),
		output: out,
	}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	if err := p.waitReady(motoStartTimeout); err != nil {
		p.kill()
		exitCode := -1
		select {
		case <-p.exited: // Wait has set ProcessState
			exitCode = cmd.ProcessState.ExitCode()
		default:
		}
		if exitCode == exitMissing {
			return nil, errMissing{fmt.Errorf("%s: %w\n%s", argv[0], err, out.String())}
		}
		return nil, fmt.Errorf("%s: %w\noutput:\n%s", argv[0], err, out.String())
	}
	return p, nil
}

// waitReady polls the server until it answers HTTP, it exits, or timeout.
func (p *motoProcess) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/", nil)
		if err != nil {
			return fmt.Errorf("probe request: %w", err)
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before answering (%s)", p.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("no answer on %s within %s", p.url, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// kill ends the server's whole process group and waits for it to exit.
func (p *motoProcess) kill() {
	if pgid := p.cmd.Process.Pid; pgid > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
	}
	select {
	case <-p.exited:
		return
	case <-time.After(3 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(3 * time.Second):
	}
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// moduleRoot walks up from the working directory (a package directory under
// `go test`) to the directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find module root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// tailBuffer keeps the last max bytes written to it; safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Store returns a store over fresh tables in a new embedded DynamoDB, with
// its clock replaced by a fake one (2026-11-29 12:00 UTC) the test moves.
func Store(t testing.TB) (*store.Store, *clock.Fake) {
	t.Helper()
	db := Embedded(t)
	prefix := Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("storetest: create tables: %v", err)
	}
	c := clock.NewFake(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	s := store.New(db, prefix)
	s.Clock = c.Clock()
	return s, c
}

// Faulty is a store whose every request goes through a FaultyTransport, with
// a second store over the same tables that reads without faults: the test
// acts through Store and reads the truth through Truth.
type Faulty struct {
	Store     *store.Store
	Truth     *store.Store
	Transport *FaultyTransport
	Clock     *clock.Fake
}

// FaultyStore returns a Faulty over fresh tables in a new embedded DynamoDB,
// injecting faults by s. Each HTTP attempt times out after timeout, and a
// Delay fault holds its request for three times that. Both stores share one
// fake clock (2026-11-29 12:00 UTC).
func FaultyStore(t testing.TB, s Schedule, timeout time.Duration) Faulty {
	t.Helper()
	endpoint := EmbeddedEndpoint(t)
	db := Client(endpoint)
	prefix := Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("storetest: create tables: %v", err)
	}
	tr := NewFaultyTransport(s)
	tr.Hold = 3 * timeout
	t.Cleanup(tr.Settle)
	c := clock.NewFake(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	f := Faulty{
		Store:     store.New(FaultyClient(endpoint, tr, timeout), prefix),
		Truth:     store.New(db, prefix),
		Transport: tr,
		Clock:     c,
	}
	f.Store.Clock, f.Truth.Clock = c.Clock(), c.Clock()
	f.Store.IDs = &ids.Generator{Clock: c.Clock()}
	return f
}

// Control returns the use cases over s on s's clock, with the default stale
// window and a logger that discards.
func Control(s *store.Store) *control.Service {
	return control.New(control.Config{Store: s, Clock: s.Clock, Logger: slog.New(slog.DiscardHandler)})
}
