package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/acks"
	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/agent/internal/logship"
	"github.com/dreamlake/lakeshore/agent/internal/machineid"
	"github.com/dreamlake/lakeshore/agent/internal/notify"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/agent/internal/publish"
	"github.com/dreamlake/lakeshore/agent/internal/spot"
	"github.com/dreamlake/lakeshore/agent/internal/wakeclient"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// ErrHelloFailed is returned by Run when hello was refused or its retries ran
// out: exit 1, or exit 3 when the error also matches ErrHelloRefused
// (ExitCode).
var ErrHelloFailed = errors.New("hello failed")

// Agent is one nymph process.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	health *health.Tracker
	runner *process.Runner
	acker  *acks.Acker
	// logs ships each run's output as it grows (docs/logs.md).
	logs *logship.Shipper
	// retention removes finished runs' directories (--keep-runs,
	// --keep-runs-size); each run is held from before it starts until its
	// ack is answered. Nil until Run makes it (nil holds nothing).
	retention *process.Retention

	// views is the lifecycle endpoint bodies read (lifecycle.go); nil
	// when it could not listen.
	views *lifecycle.Server
	// publisher does the work of the bodies' publish requests (nil with
	// no endpoint).
	publisher *publish.Publisher

	notify *notify.Service // READY/STOPPING/STATUS to a service manager
	runAs  *process.RunAs  // --run-as, resolved at New; nil: the daemon's account

	stopc  chan struct{} // closed by the first Stop: drain
	hurryc chan struct{} // closed by the second Stop: skip the grace
	stops  int
	mu     sync.Mutex

	setupc chan setupDone // setup results to the loop

	ackMu   sync.Mutex
	ackDone map[string]func(ok bool) // health bookkeeping of acks in flight

	// testHookRunStarted, when set, is called on the loop's goroutine as
	// each body starts (tests synchronise on it instead of sleeping).
	testHookRunStarted func(invocationID string)
	// testHookPolled, when set, is called on the loop's goroutine after
	// each poll the control plane answered, with what it carried.
	testHookPolled func(req wire.PollRequest)
	// testHookFlushing, when set, is called as the final ack flush starts,
	// before it waits (tests release a held ack there).
	testHookFlushing func()

	// spot: EC2 spot notices for the loop (agent/internal/spot; the loop's
	// handling in spot.go); nil when not watching.
	spotc        <-chan spot.Notice
	spotInterval time.Duration // tests; zero: spot.DefaultInterval

	// testRetentionSwept, when set, hears what each run-directory sweep did.
	testRetentionSwept func(process.SweepResult)
	// testRunnerConfig, when set, adjusts the runner's config before Run
	// makes the runner (tests: hooks, the group liveness check).
	testRunnerConfig func(*process.Config)
	// finishSlack is how much longer than --kill-after finish waits for
	// killed bodies (zero: defaultFinishSlack; tests shorten it).
	finishSlack time.Duration
}

// New returns an agent for cfg; Run starts it.
func New(cfg Config) (*Agent, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var runAs *process.RunAs
	if cfg.RunAs != "" {
		if runAs, err = process.LookupRunAs(cfg.RunAs, os.Geteuid()); err != nil {
			return nil, err
		}
		if err := runAs.Reachable(cfg.Workdir); err != nil {
			return nil, err
		}
	}
	return &Agent{
		runAs:  runAs,
		cfg:    cfg,
		log:    cfg.Logger,
		health: health.New(cfg.Clock, health.Options{RequestOverdue: requestTimeout, RequestStall: 4 * requestTimeout}),
		notify: notify.New(cfg.Notifier, cfg.Logger, StopBudget(cfg.Grace, cfg.KillAfter)),
		stopc:  make(chan struct{}),
		hurryc: make(chan struct{}),
	}, nil
}

// now reads the daemon's clock (Config.Clock).
func (a *Agent) now() time.Time { return a.cfg.Clock.Now() }

// Health reports the agent's health record (for tests and introspection).
func (a *Agent) Health() *health.Tracker { return a.health }

// stopping reports whether Stop was called.
func (a *Agent) stopping() bool {
	select {
	case <-a.stopc:
		return true
	default:
		return false
	}
}

// Stop asks the agent to drain (the first call: a signal) and then to skip
// the grace period (a second call: a second signal).
func (a *Agent) Stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stops++
	switch a.stops {
	case 1:
		close(a.stopc)
	case 2:
		close(a.hurryc)
	}
}

// session is what one hello answered.
type session struct {
	workerID   string
	token      string
	staleAfter time.Duration
	interval   time.Duration
	// longPoll is how long an idle poll asks the control plane to hold it
	// (timeout_s; hello's long_poll_s, at most the interval); 0: it does not.
	longPoll time.Duration
	// wakeURL is the control plane's wake channel (hello's wake_url; "":
	// none), and wakeInterval how often an idle daemon polls while its
	// socket is up (wake_poll_interval_s, never shorter than interval).
	wakeURL      string
	wakeInterval time.Duration
	api          *client.Client
}

// body is what the loop needs of one run under way (a *process.Run; tests
// put in runs that never end).
type body interface {
	InvocationID() string
	Attempt() int
	Done() <-chan struct{}
	Outcome() process.Outcome
	Cancel()
	Kill()
	Pid() int
	Unconfirmed() (pgid int, pids []int)
	LogFiles() (stdout, stderr string)
	Signal(sig syscall.Signal) bool
}

var _ body = (*process.Run)(nil)

// running is one invocation in flight.
type running struct {
	run     body
	session session // the worker (and token) that claimed it
	// view is the run's lifecycle view (nil: none); drainSignal is its
	// run_config.drain_signal ("": none), signalled once sent;
	// requeueExitCodes are its run_config.requeue_exit_codes.
	view             *lifecycle.Handle
	drainSignal      string
	signalled        bool
	requeueExitCodes []int
}

// loop state, owned by Run's goroutine.
type state struct {
	// phase is the daemon's phase; enter (phase.go) is its one write.
	phase phase
	// setupProgress is the setup phase's sub-states (phase.go).
	setupProgress
	sess         session
	wake         *wakeclient.Client  // the wake socket; nil in tests that build a state
	runs         map[string]*running // by invocation id
	setupQueue   []wire.Command      // CP setup commands not yet run, in order
	setupSeen    map[string]bool
	setupResults []wire.SetupResult // finished, not yet reported
	// hostSetup is the host setup in effect: --host-setup, or the one an
	// adopt command gave (setupProgress.adopting names its key until it
	// succeeded); hostKey is the key polls advertise (adopt.go).
	hostSetup []string
	hostKey   string
	// adoptFailed is the key of a failed adoption the next poll reports;
	// adoptRefused remembers every such key: it is never tried again.
	adoptFailed  string
	adoptRefused map[string]bool
	rewake       bool   // the key changed: the wake socket must listen for it
	notReady     string // why keep-alive found the daemon not ready (empty: it was ready)
	// setupCtx bounds every setup command: cancelled when the daemon
	// terminates, so a hung one is killed (SIGTERM, --kill-after, SIGKILL)
	// instead of outliving the process; setupWG counts their goroutines.
	setupCtx  context.Context
	stopSetup context.CancelFunc
	setupWG   sync.WaitGroup
	loopDone  chan struct{} // closed as the loop returns: no one reads setupc any more
	// stopCtx ends at the first stop (Run): a re-hello's retries give way
	// to it, the loop's own requests do not.
	stopCtx context.Context

	byeReason string
	helloErr  error // why the hello after a 410/401 failed: what Run returns
	// machineConflict: another process replaced this worker (410
	// replaced); Run returns ErrMachineConflict, and the daemon stops
	// for exitConflict, with no bye.
	machineConflict bool
	idleSince       time.Time
	pollFailures    int
	spotReclaim     time.Time // spot: when EC2 reclaims the instance (zero: no notice)
	abandoned       int       // runs whose outcome is not known, for bye's inflight_abandoned
}

// exitConflict is why a daemon that another process replaced stops
// (exit 5): that process said hello with its machine id. It is no bye
// reason, as such a daemon says no bye (finish).
const exitConflict = "conflict"

// exitReason reports why the daemon stops, for its log and its service
// manager's status: its bye's reason, or exitConflict.
func (st *state) exitReason() string {
	if st.machineConflict {
		return exitConflict
	}
	return st.byeReason
}

type setupDone struct {
	result wire.SetupResult
	host   bool // a --host-setup command, not a CP command
	index  int
}

// Run runs the daemon until it has drained and said bye (nil), or hello
// failed (ErrHelloFailed), or start-up failed. Any other error — start-up,
// or the loop's panic (ErrLoopPanicked) — reads failed:runtime in health.
func (a *Agent) Run(ctx context.Context) (err error) {
	defer func() {
		if err != nil && !errors.Is(err, ErrHelloFailed) && !errors.Is(err, ErrNotReady) {
			a.health.Failed(health.FailedRuntime)
		}
	}()
	cfg := a.cfg
	// Two contexts. stopCtx ends at the first stop: it carries what a stop
	// cuts short — boot, hello's retries, a re-hello's retries. ctx carries
	// what must still go out after a stop: the loop's polls during the
	// drain (a poll in flight when the signal comes must not be cut off),
	// the resend of spooled acks. Inside the loop the stop starts the drain
	// (stopc).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopCtx, cancelStop := context.WithCancel(ctx)
	defer cancelStop()
	go func() {
		select {
		case <-a.stopc:
			cancelStop()
		case <-stopCtx.Done():
		}
	}()
	a.health.SetPhase(phaseBooting.health())
	a.health.SetRunState(health.RunStarting)

	stopIntrospect, bound, err := health.ServeIntrospect(cfg.IntrospectAddr, a.health, a.log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = stopIntrospect(sctx)
	}()
	if bound != "" {
		a.log.Info("introspection listening", "addr", bound)
	}
	if err := os.MkdirAll(cfg.Workdir, 0o700); err != nil {
		return fmt.Errorf("workdir: %w", err)
	}
	defer a.startViews()()
	spool, err := acks.OpenSpool(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	ledger, err := process.OpenLedger(cfg.StateDir, a.log)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	// Bodies an earlier process on this state dir left running (it was
	// SIGKILLed: OOM, no service manager) die before anything else: this
	// hello retires that process's worker, and the control plane hands their
	// work out again, so they must not run on beside it (docs/agent.md).
	ledger.Sweep(cfg.KillAfter)

	a.retention = process.NewRetention(process.RetentionConfig{
		Workdir: cfg.Workdir, Keep: cfg.KeepRuns, MaxBytes: cfg.KeepRunsSize, Clock: cfg.Clock, Logger: a.log,
		Swept: a.testRetentionSwept,
	})
	// An earlier process's runs whose acks are still spooled keep their
	// directories until those acks are answered (ackAnswered releases them).
	if spooled, err := spool.List(); err == nil {
		for _, sa := range spooled {
			a.retention.Hold(sa.Ack.InvocationID, sa.Ack.Attempt)
		}
	}
	retentionCtx, stopRetention := context.WithCancel(context.WithoutCancel(ctx))
	retentionDone := make(chan struct{})
	go func() {
		defer close(retentionDone)
		a.retention.Run(retentionCtx)
	}()
	defer func() {
		stopRetention()
		// A sweep under way ends with the directory it is removing; exit
		// does not wait much longer for it.
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-retentionDone:
		case <-t.C:
		}
	}()

	a.ackDone = map[string]func(bool){}
	a.acker = acks.New(spool, acks.Options{Logger: a.log, HTTP: cfg.HTTP, OnAnswered: a.ackAnswered, Clock: cfg.Clock})
	machineID, source, err := machineid.Lookup(stopCtx, cfg.MachineID, machineid.Options{IMDSEndpoint: cfg.IMDSEndpoint})
	if err != nil {
		return fmt.Errorf("machine id: %w", err)
	}
	bootID := BootID()
	hk := hostkey.Of(cfg.HostSetup)
	a.log.Info("booting", "machine_id", machineID, "machine_id_source", source, "host_key", hk, "queue", cfg.Queue)
	// spot: watch for interruption notices on EC2 or at an explicit endpoint,
	// until Run returns (a signal's drain must still see a reclaim coming).
	if endpoint, ok := spot.Endpoint(cfg.IMDSEndpoint, source, os.Getenv); ok {
		spotCtx, stopSpot := context.WithCancel(context.WithoutCancel(ctx))
		defer stopSpot()
		a.spotc = spot.Watch(spotCtx, spot.Options{Endpoint: endpoint, Interval: a.spotInterval, Logger: a.log})
		a.log.Info("watching for spot interruption notices", "imds", endpoint)
	}

	// Acks a previous process spooled go first: its outcomes must land before
	// this hello retires that process's worker and hands its work out again.
	resendCtx, cancelResend := context.WithTimeout(stopCtx, requestTimeout)
	if err := a.acker.Resend(resendCtx); err != nil {
		a.log.Warn("spooled acks not all delivered before hello; still retrying", "error", err.Error())
		go func() { _ = a.acker.Resend(ctx) }()
	}
	cancelResend()

	rcfg := process.Config{
		Workdir: cfg.Workdir, KillAfter: cfg.KillAfter,
		BaseEnv: process.DefaultBaseEnv(os.Getenv, cfg.PassEnv...), Logger: a.log, RunAs: a.runAs,
		Clock: cfg.Clock, Ledger: ledger,
		WarmCapacity: cfg.Capacity, WarmKeepAlive: cfg.WarmKeepAlive,
	}
	if a.views != nil {
		rcfg.Runtime = a.views // warm processes pull their invocations there (docs/warm.md)
	}
	if a.testRunnerConfig != nil {
		a.testRunnerConfig(&rcfg)
	}
	a.runner = process.New(rcfg)
	// Warm processes end before the runtime API they pull from (deferred
	// earlier, so it stops later): told to end, they get the grace to run
	// their on_shutdown hooks, the drain having told them already.
	defer a.runner.CloseWarm(cfg.KillAfter)
	a.logs = logship.New(logship.Config{Retryable: client.Retryable, Clock: cfg.Clock, Logger: a.log})
	logsCtx, stopLogs := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLogs()
	go a.logs.Run(logsCtx)
	hello := wire.HelloRequest{
		MachineID: machineID, BootID: bootID, Label: cfg.Label, Tags: cfg.Tags,
		Lanes:          []string{cfg.Queue},
		Capabilities:   wire.Capabilities{MaxConcurrency: &cfg.Capacity},
		Versions:       map[string]string{"nymph": cfg.Version},
		HostKey:        hk,
		AdoptHostSetup: cfg.AdoptHostSetup,
	}
	st := &state{runs: map[string]*running{}, setupSeen: map[string]bool{}, idleSince: a.now()}
	st.sess, err = a.hello(stopCtx, hello)
	if err != nil {
		if stopCtx.Err() != nil {
			a.log.Info("stopped before hello was answered; no worker to say bye for")
			a.health.Stopped()
			return nil
		}
		a.health.Failed(health.FailedRegistration)
		return err
	}
	st.stopCtx = stopCtx
	return a.runLoop(ctx, st, hello)
}
