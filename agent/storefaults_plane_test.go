package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// sfSeed reads LAKESHORE_FAULT_SEED (default sfDefaultSeed) and logs it, so
// a failure can be replayed.
func sfSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(sfDefaultSeed)
	if v := os.Getenv("LAKESHORE_FAULT_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LAKESHORE_FAULT_SEED=%q: want an unsigned integer", v)
		}
		seed = n
	}
	t.Logf("fault seed %d (replay: LAKESHORE_FAULT_SEED=%d go test -race -run '^%s$' ./agent/)", seed, seed, t.Name())
	return seed
}

// sfRate reads LAKESHORE_FAULT_RATE (default sfDefaultRate).
func sfRate(t *testing.T) float64 {
	t.Helper()
	v := os.Getenv("LAKESHORE_FAULT_RATE")
	if v == "" {
		return sfDefaultRate
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 0.5 {
		t.Fatalf("LAKESHORE_FAULT_RATE=%q: want a number in (0, 0.5]", v)
	}
	t.Logf("fault rate %g", f)
	return f
}

// sfPlane is a control plane whose store goes through a FaultyTransport.
type sfPlane struct {
	*apitest.Plane
	tr  *storetest.FaultyTransport
	log *logRecorder // the control plane's own log
	op  *client.Client
}

func newSFPlane(t *testing.T, tr *storetest.FaultyTransport, timeout time.Duration) *sfPlane {
	t.Helper()
	log := newLogRecorder()
	p := apitest.NewWith(t, apitest.Options{Transport: tr, ClientTimeout: timeout}, func(c *apitest.Config) {
		c.Control.StaleAfter = sfStaleAfter
		c.Logger = log.logger()
	})
	return &sfPlane{Plane: p, tr: tr, log: log, op: client.New(p.URL, apitest.OperatorToken)}
}

// summary counts what the control plane's log says it did about faults.
func (p *sfPlane) summary() string {
	return fmt.Sprintf("control plane: %d lost claims handed back by reconcile, %d 5xx answers",
		len(p.log.find(sfMsg("redelivered an invocation its worker does not know"))),
		len(p.log.find(func(r logRecord) bool { return r.Level >= slog.LevelError })))
}

// sfAgent is one daemon running in process.
type sfAgent struct {
	a       *Agent
	log     *logRecorder
	machine string
	done    chan error
	ended   bool
}

// startSFAgent starts a daemon on machine with capacity; mod may set test
// hooks before it runs. The test's cleanup stops it if the test did not.
func startSFAgent(t *testing.T, p *sfPlane, machine string, capacity int, mod func(*Agent)) *sfAgent {
	t.Helper()
	dir := t.TempDir()
	log := newLogRecorder()
	a, err := New(Config{
		ControlPlane: p.URL, EnrollToken: apitest.EnrollToken, Queue: sfQueue, Capacity: capacity,
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
		MachineID: machine, IntrospectAddr: "off", PollInterval: sfPollEvery,
		Grace: 10 * time.Second, KillAfter: time.Second,
		Logger: log.logger(), Notifier: nopNotifier{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(a)
	}
	s := &sfAgent{a: a, log: log, machine: machine, done: make(chan error, 1)}
	go func() { s.done <- a.Run(context.Background()) }()
	t.Cleanup(func() {
		if !s.ended {
			a.Stop()
			a.Stop()
			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
			}
		}
	})
	return s
}

// stop signals the daemon (as SIGTERM does) and waits for it to leave.
func (s *sfAgent) stop(t *testing.T) error {
	t.Helper()
	s.a.Stop()
	return s.wait(t, 30*time.Second)
}

// wait waits, at most limit, for Run to return. A daemon that does not is
// stuck: the test fails, and a second signal ends it.
func (s *sfAgent) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.ended = true
		return err
	case <-time.After(limit):
	}
	t.Errorf("daemon on %s still running %s after it was stopped: stuck (phase %s, inflight %d)",
		s.machine, limit, s.a.Health().Snapshot().Phase, s.a.Health().Snapshot().Inflight)
	s.a.Stop()
	s.a.Stop()
	select {
	case err := <-s.done:
		s.ended = true
		return err
	case <-time.After(limit):
		t.Fatalf("daemon on %s did not end after a second signal either", s.machine)
		return nil
	}
}

// sfDaemonRetries counts the daemons' own retries, from their logs.
func sfDaemonRetries(agents []*sfAgent) string {
	var acks, polls, hellos, rehellos int
	for _, ag := range agents {
		acks += len(ag.log.find(sfMsg("ack not answered; will retry")))
		polls += len(ag.log.find(sfMsg("poll failed")))
		hellos += len(ag.log.find(sfMsg("hello failed; retrying")))
		rehellos += len(ag.log.find(sfMsg("the control plane let go of this worker; saying hello again")))
	}
	return fmt.Sprintf("%d acks resent, %d polls failed, %d hellos retried, %d re-hellos", acks, polls, hellos, rehellos)
}

func sfMsg(msg string) func(logRecord) bool {
	return func(r logRecord) bool { return r.Msg == msg }
}

// sfSubmit submits req as an operator or the CLI would against a control
// plane that answers 5xx now and then: the same request, idempotency key
// included, again after a 5xx or a transport error, a bounded number of
// times.
func sfSubmit(ctx context.Context, op *client.Client, req wire.SubmitRequest) (wire.Invocation, int, error) {
	var inv wire.Invocation
	tries, err := sfRetry(20, func() (err error) {
		inv, _, err = op.Submit(ctx, req)
		return err
	})
	return inv, tries, err
}

// sfRetry runs fn until it succeeds, fails for good (a 4xx) or has run
// tries times, backing off a little between tries; it reports how many
// tries it made.
func sfRetry(tries int, fn func() error) (int, error) {
	for try := 1; ; try++ {
		err := fn()
		if err == nil || try >= tries || !client.Retryable(err) {
			return try, err
		}
		time.Sleep(time.Duration(try) * 20 * time.Millisecond) // backoff, not synchronisation
	}
}

// sfSubmitted is what the operators' submits answered, by idempotency key.
type sfSubmitted struct {
	mu    sync.Mutex
	ids   map[string]string
	extra int // tries beyond the first
}

func (s *sfSubmitted) add(key, id string, tries int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[key] = id
	s.extra += tries - 1
}

func (s *sfSubmitted) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func (s *sfSubmitted) retries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extra
}

func (s *sfSubmitted) invocationIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Values(s.ids))
}

// sfPhantomDaemon is a daemon that said hello, polled once and crashed.
type sfPhantomDaemon struct {
	machine, workerID string
	claimed           []string
}

// sfPhantom says hello for machine and polls once with room for capacity
// runs, each retried as nymph retries them, and never polls again: the
// crash after a claim that only the sweep (or EC2) can hand back.
func sfPhantom(t *testing.T, ctx context.Context, p *sfPlane, machine string, capacity int) sfPhantomDaemon {
	t.Helper()
	enroll := client.New(p.URL, apitest.EnrollToken)
	var hello wire.HelloResponse
	if _, err := sfRetry(10, func() (err error) {
		hello, err = enroll.Hello(ctx, wire.HelloRequest{
			MachineID: machine, BootID: "boot-" + machine, Lanes: []string{sfQueue},
			Capabilities: wire.Capabilities{MaxConcurrency: ptr(capacity)},
		})
		return err
	}); err != nil {
		t.Fatalf("hello for %s: %v", machine, err)
	}
	api := enroll.WithToken(hello.Token)
	var resp wire.PollResponse
	if _, err := sfRetry(10, func() (err error) {
		resp, err = api.Poll(ctx, wire.PollRequest{
			WorkerID: hello.WorkerID, Queue: sfQueue, Invocations: []string{}, Phase: wire.PhaseReady,
			UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(capacity), CurrentInvocations: ptr(0)},
		})
		return err
	}); err != nil {
		t.Fatalf("poll for %s: %v", machine, err)
	}
	d := sfPhantomDaemon{machine: machine, workerID: hello.WorkerID}
	for _, c := range resp.Commands {
		if c.Type == wire.CommandRun {
			d.claimed = append(d.claimed, c.Invocation.InvocationID)
		}
	}
	return d
}
